// Package presence keeps a rep's CellPresence in etcd under a lease: it grants the lease,
// writes the presence, keeps the lease alive, and when etcd says the lease or the key is lost
// (expired, revoked, deleted behind its back) grants a new lease and writes the presence
// again, until it is stopped; then it revokes the lease so the cell disappears at once. An
// etcd outage alone never loses the presence: the rep keeps the same lease once etcd is back.
package presence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/wire"
)

// Bounds of the retries while etcd cannot be reached.
const (
	minBackoff    = 100 * time.Millisecond
	revokeTimeout = 5 * time.Second
	// resumeBackoff caps the wait between questions about the lease while etcd is away: etcd
	// gives every lease a full TTL when it comes back, and the rep must renew within it.
	resumeBackoff = time.Second
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
// TTL (keepAlive renews every third, so that is a renewal gone unanswered), but never less
// than a renewal interval and 1.5 s, so that short TTLs on a busy machine do not flap.
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
//
// Only etcd decides that the registration is lost. When the keepalive ends because etcd could
// not be reached for a TTL, the lease is not taken for dead: etcd extends every lease when it
// comes back, so the rep asks etcd, once it answers, whether its lease still lives, and if so
// goes on keeping that same lease alive (writing its key again under it if the key went).
// It never revokes a lease it still holds, so an etcd outage never makes a healthy cell
// disappear.
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
		for lease != 0 {
			lost := p.hold(ctx, lease, rev)
			if ctx.Err() != nil {
				p.revoke(lease)
				return nil
			}
			if lost.keyDeleted {
				// Someone deleted the key while the lease lived: start over on a new lease,
				// dropping the old one so that it does not linger.
				p.log.Warn("cell presence lost, registering again", "reason", lost.why)
				p.revoke(lease)
				break
			}
			p.log.Warn("cell presence keepalive ended; asking etcd whether the lease lives", "reason", lost.why)
			if lease, rev, err = p.resume(ctx, lease); err != nil {
				return nil
			}
		}
	}
}

// resume waits until etcd answers and finds out whether lease still lives, by renewing it once.
// If it does, it makes sure the presence key is there under it and returns the lease and the
// revision to watch the key from; if the lease is gone, it returns lease 0 (the cell registers
// anew).
//
// It asks with a renewal rather than TimeToLive: a renewal of a lease etcd holds is answered
// without waiting for etcd's apply loop to catch up (TimeToLive waits for it, up to a second,
// and then fails for the client to ask again), and it gives the lease a whole TTL in the same
// answer. On an overloaded etcd the question is then cheaper, and the answer is not already
// stale when the keepalive starts again.
func (p *Presence) resume(ctx context.Context, lease clientv3.LeaseID) (clientv3.LeaseID, int64, error) {
	var rev int64
	err := retry.Do(ctx, retry.Policy{Initial: minBackoff, Max: resumeBackoff}, 0, func() error {
		cctx, cancel := context.WithTimeout(ctx, p.ttl)
		defer cancel()
		ka, err := p.etcd.KeepAliveOnce(cctx, lease)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			p.log.Warn("cell presence lease expired, registering again", "lease", fmt.Sprintf("%x", int64(lease)))
			lease = 0
			return nil
		}
		if err != nil {
			return fmt.Errorf("lease renewal: %w", err)
		}
		key := CellKey(p.value().GetCellId())
		get, err := p.etcd.Get(cctx, key)
		if err != nil {
			return fmt.Errorf("get %s: %w", key, err)
		}
		if len(get.Kvs) == 1 && clientv3.LeaseID(get.Kvs[0].Lease) == lease {
			// Watch from the read's revision, not the key's: after a restore from a backup the
			// key's revision is older than the compacted history, and a watch from it fails.
			rev = get.Header.Revision
			p.log.Info("cell presence lease still alive, keeping it", "lease", fmt.Sprintf("%x", int64(lease)), "ttl", ka.TTL)
			return nil
		}
		b, err := wire.Marshal(p.value())
		if err != nil {
			return fmt.Errorf("encode presence: %w", err)
		}
		put, err := p.etcd.Put(cctx, key, string(b), clientv3.WithLease(lease))
		if err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
		rev = put.Header.Revision
		p.log.Info("cell presence written again under its live lease", "lease", fmt.Sprintf("%x", int64(lease)))
		return nil
	}, func(err error, next time.Duration) {
		p.log.Warn("etcd unreachable, will ask again about the cell's lease", "error", err, "backoff", next)
	})
	return lease, rev, err
}

// register grants a lease and writes the presence under it; it returns the lease and the
// revision of the write.
func (p *Presence) register(ctx context.Context) (clientv3.LeaseID, int64, error) {
	value := p.value()
	b, err := wire.Marshal(value)
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

// loss says why hold returned.
type loss struct {
	why string
	// keyDeleted is set when the presence key was deleted while the lease was being kept.
	keyDeleted bool
}

// hold keeps the lease alive until its keepalive ends (etcd unreachable for a TTL, or the
// lease gone), the key is deleted or ctx ends, and says why it returned.
func (p *Presence) hold(ctx context.Context, lease clientv3.LeaseID, rev int64) loss {
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	alive := p.keepAlive(hctx, lease) // keepalive.go
	p.setHeld(true)                   // granted just now
	defer p.setHeld(false)
	key := CellKey(p.value().GetCellId())
	watch := p.etcd.Watch(hctx, key, clientv3.WithRev(rev+1))
	for {
		select {
		case <-ctx.Done():
			return loss{why: "stopping"}
		case _, ok := <-alive:
			if !ok {
				return loss{why: "keepalive ended: lease expired, revoked, or etcd unreachable for its TTL"}
			}
			p.setHeld(true)
		case wr, ok := <-watch:
			if !ok {
				return loss{why: "watch of the presence key ended"}
			}
			if err := wr.Err(); err != nil {
				return loss{why: fmt.Sprintf("watch of the presence key failed: %v", err)}
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return loss{why: "presence key deleted", keyDeleted: true}
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
