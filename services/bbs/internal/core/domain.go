package core

import (
	"context"
	"fmt"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// UpsertDomain marks a domain fresh for ttl seconds (0: forever). The record lives under an
// etcd lease of that TTL, so it vanishes on its own when not refreshed.
func (c *Core) UpsertDomain(ctx context.Context, name string, ttl int64) error {
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

// Tags lists the distinct placement tags of registered cells, lower-cased and sorted.
func (c *Core) Tags() []string {
	cells, _ := c.st.Cells()
	seen := map[string]struct{}{}
	for _, cell := range cells {
		for _, tag := range cell.GetPlacementTags() {
			seen[strings.ToLower(tag)] = struct{}{}
		}
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// ResolveLinks resolves the links a desired LRP consumes. Link resolution against providers is
// not part of the BBS yet, so only LRPs that consume no links resolve (to an empty map).
func (c *Core) ResolveLinks(guid string) (map[string]*modelsv1.ResolvedLink, error) {
	d, _ := c.st.DesiredLRP(guid)
	if d == nil {
		return nil, rpcerr.NotFound("desired lrp %q not found", guid)
	}
	if n := len(d.GetLinks().GetConsumes()); n > 0 {
		return nil, rpcerr.FailedPrecondition("desired lrp %q consumes %d links; this BBS does not resolve links between LRPs yet", guid, n)
	}
	return map[string]*modelsv1.ResolvedLink{}, nil
}

// DesiredLRP returns one desired LRP or NotFound, with the revision read.
func (c *Core) DesiredLRP(guid string) (*modelsv1.DesiredLRP, int64, error) {
	d, rev := c.st.DesiredLRP(guid)
	if d == nil {
		return nil, rev, rpcerr.NotFound("desired lrp %q not found", guid)
	}
	return d, rev, nil
}

// Task returns one task or NotFound, with the revision read.
func (c *Core) Task(guid string) (*modelsv1.Task, int64, error) {
	t, rev := c.st.Task(guid)
	if t == nil {
		return nil, rev, rpcerr.NotFound("task %q not found", guid)
	}
	return t, rev, nil
}
