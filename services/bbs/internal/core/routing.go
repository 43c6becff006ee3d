package core

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// RoutesReportTTL is the lease, in seconds, of a route-emitter's report: one that stops
// reporting for this long is no longer waited for by drains. Route-emitters report at least
// every third of it.
const RoutesReportTTL = 10

// Routing records what the route-emitters have published, which drains wait for (drain.go).
type Routing struct{ *deps }

// ReportRoutesPublished records that route-emitter emitterID's table, as sent to its routers,
// reflects every event up to revision. The record lives under a lease of RoutesReportTTL
// seconds, renewed by every report; a report older than the recorded one changes nothing.
func (c *Routing) ReportRoutesPublished(ctx context.Context, emitterID string, revision int64) error {
	cli := c.st.Client()
	old, lease, ok := c.st.RoutesPublishedBy(emitterID)
	if ok && lease != 0 {
		if _, err := cli.KeepAliveOnce(ctx, clientv3.LeaseID(lease)); err != nil {
			ok = false // expired or revoked: a new lease below
		}
	}
	if ok && revision <= old {
		return nil // the lease is renewed; nothing newer to record
	}
	if !ok || lease == 0 {
		granted, err := cli.Grant(ctx, RoutesReportTTL)
		if err != nil {
			return rpcerr.Unavailable("report routes published by %s: grant lease: %v", emitterID, err)
		}
		lease = int64(granted.ID)
	}
	if _, err := c.st.Update(ctx, func(t *store.Txn) error {
		return t.Put(store.RoutesPublishedKey(emitterID), wrapperspb.Int64(revision), clientv3.WithLease(clientv3.LeaseID(lease)))
	}); err != nil {
		return fmt.Errorf("report routes published by %s: %w", emitterID, err)
	}
	return nil
}
