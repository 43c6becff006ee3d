// Package presence keeps a rep's CellPresence in etcd under a lease: it grants the lease,
// writes the presence, keeps the lease alive, and when the lease or the key is lost (expired,
// revoked, deleted behind its back) grants a new lease and writes the presence again, until
// it is stopped; then it revokes the lease so the cell disappears at once.
package presence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/retry"
)

// Bounds of the retries while etcd cannot be reached.
const (
	minBackoff    = 100 * time.Millisecond
	revokeTimeout = 5 * time.Second
)

// Presence registers one cell.
type Presence struct {
	etcd  *clientv3.Client
	ttl   time.Duration
	value func() *modelsv1.CellPresence
	log   hclog.Logger

	mu      sync.Mutex
	lease   clientv3.LeaseID
	holding bool      // from a registration until its lease or key is lost
	renewed time.Time // when the held lease was last granted or renewed
}

// New builds a Presence that writes value() (read at every registration) under a lease of
// ttl.
func New(etcd *clientv3.Client, ttl time.Duration, value func() *modelsv1.CellPresence, logger hclog.Logger) *Presence {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Presence{etcd: etcd, ttl: ttl, value: value, log: logger}
}

// Lease is the lease the presence is currently attached to (0 before the first registration).
func (p *Presence) Lease() clientv3.LeaseID {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lease
}

// Held reports whether the cell's presence is in place as far as the rep can tell: registered,
// the lease's keepalive stream open, and the lease granted or renewed less than lapseAfter(TTL)
// ago. When it is not, the cell is about to disappear from the BBS, or has: the rep takes no
// new work. A host cut off from etcd says so at once (its keepalive stream ends) or, when its
// connection hangs instead, once a renewal has gone unanswered, while its lease still runs.
func (p *Presence) Held() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holding && time.Since(p.renewed) < lapseAfter(p.ttl)
}

// lapseAfter is how long after its last renewal a lease counts as lapsing: two thirds of the
// TTL (the etcd client renews every third, checking twice a second, so that is a renewal gone
// unanswered), but never less than a renewal interval and 1.5 s, so that short TTLs on a busy
// machine do not flap.
func lapseAfter(ttl time.Duration) time.Duration {
	return max(ttl*2/3, ttl/3+1500*time.Millisecond)
}

// setHeld records whether the presence is held, and when its lease was last renewed.
func (p *Presence) setHeld(holding bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding = holding
	if holding {
		p.renewed = time.Now()
	}
}

// Run implements lifecycle.Runner: it registers the cell (retrying until etcd answers), calls
// ready, keeps the registration alive and re-registers whenever it is lost; when ctx ends it
// revokes the lease and returns nil.
func (p *Presence) Run(ctx context.Context, ready func()) error {
	var once sync.Once
	for {
		var lease clientv3.LeaseID
		var rev int64
		err := retry.Do(ctx, retry.Policy{Initial: minBackoff, Max: p.ttl}, 0, func() (err error) {
			lease, rev, err = p.register(ctx)
			return err
		}, func(err error, next time.Duration) {
			p.log.Warn("could not register the cell, retrying", "error", err, "backoff", next)
		})
		if err != nil {
			return nil // only the end of ctx stops the retries
		}
		once.Do(ready)
		why := p.hold(ctx, lease, rev)
		if ctx.Err() != nil {
			p.revoke(lease)
			return nil
		}
		p.log.Warn("cell presence lost, registering again", "reason", why)
		p.revoke(lease) // when only the key was lost, the old lease would linger
	}
}

// register grants a lease and writes the presence under it; it returns the lease and the
// revision of the write.
func (p *Presence) register(ctx context.Context) (clientv3.LeaseID, int64, error) {
	value := p.value()
	b, err := proto.Marshal(value)
	if err != nil {
		return 0, 0, fmt.Errorf("encode presence: %w", err)
	}
	ttl := int64(math.Ceil(p.ttl.Seconds()))
	gctx, cancel := context.WithTimeout(ctx, p.ttl)
	defer cancel()
	grant, err := p.etcd.Grant(gctx, ttl)
	if err != nil {
		return 0, 0, fmt.Errorf("grant lease: %w", err)
	}
	key := CellKey(value.GetCellId())
	put, err := p.etcd.Put(gctx, key, string(b), clientv3.WithLease(grant.ID))
	if err != nil {
		p.revoke(grant.ID)
		return 0, 0, fmt.Errorf("put %s: %w", key, err)
	}
	p.mu.Lock()
	p.lease = grant.ID
	p.mu.Unlock()
	p.log.Info("cell registered", "key", key, "lease", fmt.Sprintf("%x", int64(grant.ID)), "ttl", grant.TTL)
	return grant.ID, put.Header.Revision, nil
}

// hold keeps the lease alive until it is lost, the key is deleted or ctx ends, and says why it
// returned.
func (p *Presence) hold(ctx context.Context, lease clientv3.LeaseID, rev int64) string {
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	alive, err := p.etcd.KeepAlive(hctx, lease)
	if err != nil {
		return fmt.Sprintf("keep lease alive: %v", err)
	}
	p.setHeld(true) // granted just now
	defer p.setHeld(false)
	key := CellKey(p.value().GetCellId())
	watch := p.etcd.Watch(hctx, key, clientv3.WithRev(rev+1))
	for {
		select {
		case <-ctx.Done():
			return "stopping"
		case _, ok := <-alive:
			if !ok {
				return "lease expired or revoked"
			}
			p.setHeld(true)
		case wr, ok := <-watch:
			if !ok {
				return "watch of the presence key ended"
			}
			if err := wr.Err(); err != nil {
				return fmt.Sprintf("watch of the presence key failed: %v", err)
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return "presence key deleted"
				}
			}
		}
	}
}

// revoke drops a lease (and so the presence), bounded by revokeTimeout.
func (p *Presence) revoke(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
	defer cancel()
	if _, err := p.etcd.Revoke(ctx, lease); err != nil && !errors.Is(err, context.Canceled) {
		p.log.Debug("could not revoke the lease", "lease", fmt.Sprintf("%x", int64(lease)), "error", err)
	}
}
