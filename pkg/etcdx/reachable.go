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

// reach waits for etcd and returns the context to call it with.
func (g *guardedKV) reach(ctx context.Context) (context.Context, error) {
	if !AwaitReachable(ctx, g.cli, g.bound) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, rpcerr.UnavailableRetry(UnreachableRetryAfter, "etcd unreachable for %s: nothing was sent", g.bound)
	}
	return clientv3.WithRequireLeader(ctx), nil
}

// written classifies the error of a write that was sent.
func written(err error) error {
	if err == nil || RefusedBeforeProposal(err) {
		return err
	}
	return rpcerr.Indeterminate("etcd did not confirm the change (%v): it may or may not have been made", err)
}

func (g *guardedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	ctx, err := g.reach(ctx)
	if err != nil {
		return nil, err
	}
	return g.KV.Get(ctx, key, opts...)
}

func (g *guardedKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	ctx, err := g.reach(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := g.KV.Put(ctx, key, val, opts...)
	return resp, written(err)
}

func (g *guardedKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	ctx, err := g.reach(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := g.KV.Delete(ctx, key, opts...)
	return resp, written(err)
}

func (g *guardedKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	ctx, err := g.reach(ctx)
	if err != nil {
		return clientv3.OpResponse{}, err
	}
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
	ctx, err := t.g.reach(t.ctx)
	if err != nil {
		return nil, err
	}
	resp, err := t.g.KV.Txn(ctx).If(t.cmps...).Then(t.thenOps...).Else(t.elseOps...).Commit()
	return resp, written(err)
}
