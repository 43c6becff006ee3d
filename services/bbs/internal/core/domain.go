package core

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// Domains keeps domains fresh: a fresh domain's instances that are no longer desired are
// retired by convergence; a stale domain keeps them.
type Domains struct{ *deps }

// UpsertDomain marks a domain fresh for ttl seconds (0: forever). The record lives under an
// etcd lease of that TTL, so it vanishes on its own when not refreshed.
func (c *Domains) UpsertDomain(ctx context.Context, name string, ttl int64) error {
	cli := c.st.Client()
	_, oldLease := c.st.Domain(name)
	var opts []clientv3.OpOption
	if ttl > 0 {
		lease, err := cli.Grant(ctx, ttl)
		if err != nil {
			return rpcerr.Unavailable("upsert domain %s: grant lease: %v", name, err)
		}
		opts = append(opts, clientv3.WithLease(lease.ID))
	}
	if _, err := c.st.Update(ctx, func(t *store.Txn) error {
		return t.Put(store.DomainKey(name), &modelsv1.Domain{Name: name, TtlSeconds: ttl}, opts...)
	}); err != nil {
		return fmt.Errorf("upsert domain %s: %w", name, err)
	}
	if oldLease != 0 {
		// The record moved to the new lease; the old one holds nothing now.
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(oldLease)); err != nil {
			c.log.Debug("revoking a domain's previous lease failed; it expires on its own", "domain", name, "error", err)
		}
	}
	return nil
}
