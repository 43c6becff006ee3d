package store

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/gavel-sched/gavel/pkg/retry"
)

// CompactHistory compacts etcd's history every interval until ctx ends, keeping at least one
// interval of it: each time, it compacts up to the revision it read the time before (as
// Kubernetes' API server does). Without it etcd keeps every revision of every key, its index
// and database grow with every change, and it refuses writes once the database reaches its
// quota. A subscriber resuming from a compacted revision is answered OUT_OF_RANGE and lists
// again; the store's own watch, compacted, lists again too (Run). A failed compaction is
// logged and tried again the next time. The BBS runs it on its leader only; a compaction
// someone else already made is not an error.
func (s *Store) CompactHistory(ctx context.Context, interval time.Duration) error {
	var previous int64
	for retry.Sleep(ctx, interval) {
		rev, err := s.compactUpTo(ctx, previous, interval)
		switch {
		case err == nil:
			previous = rev
		case ctx.Err() == nil:
			s.log.Warn("compacting etcd's history failed; trying again at the next interval", "error", err, "interval", interval)
		}
	}
	return nil
}

// compactUpTo compacts etcd's history up to rev (nothing when rev is 0) within timeout and
// returns etcd's current revision, read before compacting.
func (s *Store) compactUpTo(ctx context.Context, rev int64, timeout time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	current, err := s.CurrentRevision(ctx)
	if err != nil || rev == 0 {
		return current, err
	}
	// ErrCompacted: another instance, or an operator, compacted as far or further.
	if err := s.Compact(ctx, rev); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return 0, err
	}
	s.compacted.Store(rev)
	s.log.Debug("compacted etcd's history", "revision", rev, "current", current)
	return current, nil
}

// CompactedRevision is the revision this instance last compacted etcd's history up to (zero
// before its first compaction).
func (s *Store) CompactedRevision() int64 { return s.compacted.Load() }
