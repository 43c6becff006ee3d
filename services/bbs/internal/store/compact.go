package store

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// CompactHistory compacts etcd's history every interval until ctx ends, keeping at least one
// interval of it: each time, it compacts up to the revision it read the time before (as
// Kubernetes' API server does). Without it etcd keeps every revision of every key, its index
// and database grow with every change, and it refuses writes once the database reaches its
// quota. A subscriber resuming from a compacted revision is answered OUT_OF_RANGE and lists
// again; the store's own watch, compacted, lists again too (Run). A failed compaction is
// logged and tried again the next time. Only the leader runs it; a compaction another
// instance already made is not an error.
func (s *Store) CompactHistory(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var previous int64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		step, cancel := context.WithTimeout(ctx, interval)
		rev, err := s.CurrentRevision(step)
		if err == nil && previous > 0 {
			if err = s.Compact(step, previous); errors.Is(err, rpctypes.ErrCompacted) {
				err = nil // another instance, or an operator, compacted as far or further
			}
			if err == nil {
				s.compacted.Store(previous)
				s.log.Debug("compacted etcd's history", "revision", previous, "current", rev)
			}
		}
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Warn("compacting etcd's history failed; trying again at the next interval", "error", err, "interval", interval)
			continue
		}
		previous = rev
	}
}

// CompactedRevision is the revision this instance last compacted etcd's history up to (zero
// before its first compaction).
func (s *Store) CompactedRevision() int64 { return s.compacted.Load() }
