package presence

import (
	"context"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// reopenWait is the pause before the keepalive stream is opened again after it broke.
const reopenWait = 500 * time.Millisecond

// RenewalsPerTTL is how many times a presence renews its lease per TTL: a renewal is sent a
// TTL/RenewalsPerTTL after the last one was answered.
const RenewalsPerTTL = 3

// keepAlive renews lease on the cell's own etcd connection, a third of the lease's TTL after
// each renewal (at once first), and signals every renewal on the channel it returns. The channel
// is closed when the keepalive ends: etcd answered that the lease is gone (expired or revoked),
// no renewal was answered for the lease's TTL (etcd unreachable, or without a leader), or ctx
// ended. A stream that breaks is opened again after reopenWait, within that TTL.
//
// It is what clientv3's Lease.KeepAlive does, without that one's polling: the client's lessor
// wakes twice a second to look for a lease due, and once a second for deadlines, whether or
// not one is due. For a rep with one cell that is nothing; a sim host keeps a hundred cells,
// each with its own client, and at rest those wakeups were nearly all of a cell's cost
// (docs/decisions/0055-presence-keepalive.md). Here a cell wakes when a renewal is due or
// answered.
func (p *Presence) keepAlive(ctx context.Context, lease clientv3.LeaseID) <-chan struct{} {
	renewed := make(chan struct{}, 1)
	go func() {
		defer close(renewed)
		leases := clientv3.RetryLeaseClient(p.etcd)
		deadline := time.Now().Add(p.ttl) // granted or found alive just before
		for ctx.Err() == nil && time.Now().Before(deadline) {
			if gone := p.renewOver(ctx, leases, lease, &deadline, renewed); gone {
				return
			}
			t := time.NewTimer(min(reopenWait, time.Until(deadline)))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}()
	return renewed
}

// renewOver opens one keepalive stream and renews lease over it until the stream breaks, the
// deadline (the last renewal's TTL) passes, or ctx ends. It reports whether etcd answered that
// the lease is gone.
func (p *Presence) renewOver(ctx context.Context, leases pb.LeaseClient, lease clientv3.LeaseID, deadline *time.Time, renewed chan<- struct{}) (gone bool) {
	// left is what remains of the lease, for the warnings.
	left := func() time.Duration { return time.Until(*deadline).Round(time.Millisecond) }
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	stream, err := leases.LeaseKeepAlive(sctx)
	if err != nil {
		p.log.Warn("could not open the cell presence keepalive stream", "error", err, "lease_left", left())
		return false
	}
	answers := make(chan int64, 1) // each answer's TTL in seconds; closed when the stream breaks
	var broke error                // why, set before answers is closed
	go func() {
		defer close(answers)
		for {
			resp, err := stream.Recv()
			if err != nil {
				broke = err
				return
			}
			select {
			case answers <- resp.GetTTL():
			case <-sctx.Done():
				return
			}
		}
	}()
	send := time.NewTimer(0)
	defer send.Stop()
	expire := time.NewTimer(time.Until(*deadline))
	defer expire.Stop()
	var asked time.Time // when the renewal being waited for was sent
	for {
		select {
		case <-ctx.Done():
			return false
		case <-expire.C:
			p.log.Warn("no cell presence renewal answered for the lease's TTL", "ttl", p.ttl, "asked_ago", since(asked))
			return false
		case <-send.C:
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(lease)}); err != nil {
				if ctx.Err() == nil {
					p.log.Warn("cell presence keepalive stream broke on a renewal", "error", err, "lease_left", left())
				}
				return false
			}
			if asked.IsZero() {
				asked = time.Now()
			}
			// Asked again a third of the TTL on, unless an answer sets the next renewal first.
			send.Reset(p.ttl / RenewalsPerTTL)
		case ttl, ok := <-answers:
			if !ok {
				if ctx.Err() == nil {
					p.log.Warn("cell presence keepalive stream broke", "error", broke, "lease_left", left())
				}
				return false
			}
			// An answer that took longer than the pause between renewals says the lease came
			// close to lapsing: a cell lost for it is then explained by its rep's own log.
			if wait := since(asked); wait > p.ttl/RenewalsPerTTL {
				p.log.Warn("cell presence renewal answered late", "waited", wait, "ttl", p.ttl)
			}
			asked = time.Time{}
			if ttl <= 0 {
				return true
			}
			life := time.Duration(ttl) * time.Second
			*deadline = time.Now().Add(life)
			expire.Reset(life)
			send.Reset(life / RenewalsPerTTL)
			select {
			case renewed <- struct{}{}:
			default: // the holder has a renewal to read already
			}
		}
	}
}

// since is how long ago t was, rounded to the millisecond; 0 for the zero time.
func since(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return time.Since(t).Round(time.Millisecond)
}
