package etcdx

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// DefaultUnreachableTimeout is how long a write waits for etcd to be reachable, by default,
// before it is answered Unavailable.
const DefaultUnreachableTimeout = 2 * time.Second

// UnreachableRetryAfter is the wait a caller told that etcd is unreachable is advised to
// observe before sending the change again.
const UnreachableRetryAfter = time.Second

// AwaitReachable waits until cli has a ready connection to an etcd member, for at most bound
// or until ctx ends, and reports whether it has one. A write that finds etcd unreachable this
// way was never sent, so answering Unavailable for it is the truth: it will not land later.
func AwaitReachable(ctx context.Context, cli *clientv3.Client, bound time.Duration) bool {
	conn := cli.ActiveConnection()
	if conn == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready:
			return true
		case connectivity.Idle:
			conn.Connect()
		case connectivity.Shutdown:
			return false
		}
		if !conn.WaitForStateChange(ctx, st) {
			return false
		}
	}
}

// Connected reports whether cli has a ready connection to an etcd member now.
func Connected(cli *clientv3.Client) bool {
	conn := cli.ActiveConnection()
	return conn == nil || conn.GetState() == connectivity.Ready
}

// RefusedBeforeProposal reports whether etcd refused a request before it could enter the raft
// log (no leader, too many operations, too large): such a write is certain never to be
// applied. Any other failure of a write that was sent leaves its outcome unknown.
func RefusedBeforeProposal(err error) bool {
	for _, e := range []error{rpctypes.ErrNoLeader, rpctypes.ErrGRPCNoLeader, rpctypes.ErrTooManyOps,
		rpctypes.ErrGRPCTooManyOps, rpctypes.ErrRequestTooLarge, rpctypes.ErrGRPCRequestTooLarge} {
		if errors.Is(err, e) || rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(e) {
			return true
		}
	}
	return false
}

// Guard wraps cli's KV so that each call first waits at most bound for etcd to be reachable
// (rpcerr.UnavailableRetry when it is not: nothing was sent), carries etcd's require-leader
// flag (a member cut off from its quorum refuses at once), and answers a write whose outcome
// is unknown (sent, then the answer lost) with rpcerr.Indeterminate. A store that writes
// straight to etcd (nsync's) gets the BBS's outage contract through it.
func Guard(cli *clientv3.Client, bound time.Duration) clientv3.KV {
	return &guardedKV{KV: cli.KV, cli: cli, bound: bound}
}

type guardedKV struct {
	clientv3.KV
	cli   *clientv3.Client
	bound time.Duration
}

// reach waits for etcd and returns the context to call it with, which ends if etcd goes away
// mid-call (WhileReachable); call done when the call returns.
func (g *guardedKV) reach(ctx context.Context) (_ context.Context, done func(), _ error) {
	if !AwaitReachable(ctx, g.cli, g.bound) {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		return nil, nil, rpcerr.UnavailableRetry(UnreachableRetryAfter, "etcd unreachable for %s: nothing was sent", g.bound)
	}
	ctx, done = WhileReachable(clientv3.WithRequireLeader(ctx), g.cli, g.bound)
	return ctx, done, nil
}

// written classifies the error of a write that was sent.
func written(err error) error {
	if err == nil || RefusedBeforeProposal(err) {
		return err
	}
	return rpcerr.Indeterminate("etcd did not confirm the change (%v): it may or may not have been made", err)
}

func (g *guardedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	ctx, done, err := g.reach(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := g.KV.Get(ctx, key, opts...)
	if err != nil && ConnectionLost(ctx) {
		return nil, rpcerr.UnavailableRetry(UnreachableRetryAfter, "etcd went away during the read")
	}
	return resp, err
}

func (g *guardedKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	ctx, done, err := g.reach(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := g.KV.Put(ctx, key, val, opts...)
	return resp, written(err)
}

func (g *guardedKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	ctx, done, err := g.reach(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := g.KV.Delete(ctx, key, opts...)
	return resp, written(err)
}

func (g *guardedKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	ctx, done, err := g.reach(ctx)
	if err != nil {
		return clientv3.OpResponse{}, err
	}
	defer done()
	resp, err := g.KV.Do(ctx, op)
	if op.IsGet() {
		return resp, err
	}
	return resp, written(err)
}

func (g *guardedKV) Txn(ctx context.Context) clientv3.Txn {
	return &guardedTxn{g: g, ctx: ctx}
}

// guardedTxn collects a transaction and sends it through the guard at Commit.
type guardedTxn struct {
	g                *guardedKV
	ctx              context.Context
	cmps             []clientv3.Cmp
	thenOps, elseOps []clientv3.Op
}

func (t *guardedTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	return t
}

func (t *guardedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thenOps = append(t.thenOps, ops...)
	return t
}

func (t *guardedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elseOps = append(t.elseOps, ops...)
	return t
}

func (t *guardedTxn) Commit() (*clientv3.TxnResponse, error) {
	ctx, done, err := t.g.reach(t.ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := t.g.KV.Txn(ctx).If(t.cmps...).Then(t.thenOps...).Else(t.elseOps...).Commit()
	return resp, written(err)
}

// errConnectionLost ends a call whose connection to etcd went away while it was in flight.
var errConnectionLost = errors.New("connection to etcd lost while the call was in flight")

// WhileReachable is ctx for one call to etcd: it ends, with errConnectionLost as its cause,
// once cli has had no ready connection for bound, so that a call in flight when etcd goes away
// ends promptly instead of waiting for the caller's deadline (the etcd client waits for a
// connection to come back). The outcome of a write ended this way is unknown: it may have
// been sent. Call the cancel function when the call returns.
func WhileReachable(ctx context.Context, cli *clientv3.Client, bound time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	conn := cli.ActiveConnection()
	if conn == nil {
		return ctx, func() { cancel(nil) }
	}
	go func() {
		for ctx.Err() == nil {
			st := conn.GetState()
			if st == connectivity.Ready {
				conn.WaitForStateChange(ctx, st)
				continue
			}
			// Not ready: give it bound to come back.
			wctx, wcancel := context.WithTimeout(ctx, bound)
			for st != connectivity.Ready && conn.WaitForStateChange(wctx, st) {
				st = conn.GetState()
			}
			expired := wctx.Err() != nil && ctx.Err() == nil
			wcancel()
			if expired {
				cancel(errConnectionLost)
				return
			}
		}
	}()
	return ctx, func() { cancel(nil) }
}

// ConnectionLost reports whether ctx (from WhileReachable) ended because etcd went away.
func ConnectionLost(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errConnectionLost)
}
