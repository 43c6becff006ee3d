package cell

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// maxBatch bounds the items of one batch call the cell sends (the BBS takes up to 1,000).
const maxBatch = 128

// batcher coalesces one kind of BBS report by group commit, with no timer: an item goes out at
// once, as its single call, when no call of its kind is out; items that arrive while one is out
// queue, and go out together, as one batch call, when it returns. An idle cell pays no extra
// latency; a busy one (a burst placed on it) makes one call per round trip instead of one per
// instance, which is what the BBS's CPU goes on under load.
//
// Each item is still its caller's call: the caller's retry loop (Cell.call) sees the item's own
// answer, or the batch call's error when the whole call failed. An item whose caller has gone
// by the time its batch is sent is left out.
type batcher[Req, Resp proto.Message] struct {
	// one sends a single item as its own call.
	one func(ctx context.Context, req Req) (Resp, error)
	// many sends items as one batch call, each with the trace its caller's context carries,
	// and returns each item's answer or error; a non-nil error is the whole call's.
	many func(ctx context.Context, reqs []Req, traces []*modelsv1.TraceContext) ([]Resp, []error, error)
	// base and callTimeout bound a batch call.
	base        context.Context
	callTimeout time.Duration

	mu    sync.Mutex
	queue []*pendingItem[Req, Resp]
	busy  bool
	// unbatched is set once the BBS answered a batch call Unimplemented (an older BBS): from
	// then on every item goes out as its single call.
	unbatched atomic.Bool
}

// pendingItem is a queued item and where its answer goes.
type pendingItem[Req, Resp proto.Message] struct {
	ctx  context.Context
	req  Req
	done chan itemResult[Resp]
}

type itemResult[Resp any] struct {
	resp Resp
	err  error
}

// do sends req, batched with the items that queue beside it, and returns its answer.
func (b *batcher[Req, Resp]) do(ctx context.Context, req Req) (Resp, error) {
	items := b.enqueue([]context.Context{ctx}, []Req{req})
	if items == nil {
		return b.one(ctx, req)
	}
	return items[0].wait(ctx)
}

// enqueue queues reqs at once, each with its caller's context, and returns them for their
// callers to wait on. Items queued together go out together: in one call at once when no
// call is out, else in the round after it, where items queued one by one from goroutines of
// their own go out as they come, the first alone. It returns nil, queuing nothing, once the
// BBS answered a batch call Unimplemented: callers then make single calls (do).
func (b *batcher[Req, Resp]) enqueue(ctxs []context.Context, reqs []Req) []*pendingItem[Req, Resp] {
	if b.unbatched.Load() || len(reqs) == 0 {
		return nil
	}
	items := make([]*pendingItem[Req, Resp], len(reqs))
	for i, req := range reqs {
		items[i] = &pendingItem[Req, Resp]{ctx: ctxs[i], req: req, done: make(chan itemResult[Resp], 1)}
	}
	b.mu.Lock()
	b.queue = append(b.queue, items...)
	lead := !b.busy
	b.busy = true
	b.mu.Unlock()
	if lead {
		go b.drain()
	}
	return items
}

// wait returns the item's answer, or ctx's end first.
func (p *pendingItem[Req, Resp]) wait(ctx context.Context) (Resp, error) {
	select {
	case r := <-p.done:
		return r.resp, r.err
	case <-ctx.Done():
		// As a gRPC call would: a status (DeadlineExceeded, Canceled), so the caller's retry
		// sees a timeout it may retry, not an unknown error it must give up on.
		var zero Resp
		return zero, status.FromContextError(ctx.Err()).Err()
	}
}

// drain sends the queue in rounds until it is empty.
func (b *batcher[Req, Resp]) drain() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		round := make([]*pendingItem[Req, Resp], 0, n)
		for _, p := range b.queue[:n] {
			if p.ctx.Err() == nil { // its caller has gone: not sent
				round = append(round, p)
			}
		}
		b.queue = append(b.queue[:0], b.queue[n:]...)
		b.mu.Unlock()
		b.send(round)
	}
}

// send sends one round: alone as its single call, else as a batch call.
func (b *batcher[Req, Resp]) send(round []*pendingItem[Req, Resp]) {
	if len(round) == 0 {
		return
	}
	if len(round) == 1 {
		resp, err := b.one(round[0].ctx, round[0].req)
		round[0].done <- itemResult[Resp]{resp, err}
		return
	}
	if b.unbatched.Load() {
		var wg sync.WaitGroup
		for _, p := range round {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := b.one(p.ctx, p.req)
				p.done <- itemResult[Resp]{resp, err}
			}()
		}
		wg.Wait()
		return
	}
	reqs, traces := make([]Req, len(round)), make([]*modelsv1.TraceContext, len(round))
	for i, p := range round {
		reqs[i], traces[i] = p.req, tracing.Carry(p.ctx)
	}
	ctx, cancel := context.WithTimeout(b.base, b.callTimeout)
	resps, errs, err := b.many(ctx, reqs, traces)
	cancel()
	if status.Code(err) == codes.Unimplemented {
		b.unbatched.Store(true)
		b.send(round)
		return
	}
	for i, p := range round {
		switch {
		case err != nil:
			p.done <- itemResult[Resp]{err: err}
		case i >= len(resps) || i >= len(errs):
			p.done <- itemResult[Resp]{err: status.Errorf(codes.Internal, "batch answer has %d results for %d items", len(resps), len(round))}
		default:
			p.done <- itemResult[Resp]{resp: resps[i], err: errs[i]}
		}
	}
}

// batchError is a batch item's error as the status error its single call would have returned.
func batchError(e *bbsv1.BatchItemError) error {
	if e == nil {
		return nil
	}
	return status.Error(codes.Code(e.GetCode()), e.GetMessage())
}

// newBatchers builds the cell's claim and RUNNING-report batchers over bbs.
func (c *Cell) newBatchers() {
	c.claims = &batcher[*bbsv1.ClaimActualLRPRequest, *bbsv1.ClaimActualLRPResponse]{
		base: c.base, callTimeout: c.cfg.CallTimeout,
		one: func(ctx context.Context, r *bbsv1.ClaimActualLRPRequest) (*bbsv1.ClaimActualLRPResponse, error) {
			return c.bbs.ClaimActualLRP(ctx, r)
		},
		many: func(ctx context.Context, reqs []*bbsv1.ClaimActualLRPRequest, traces []*modelsv1.TraceContext) ([]*bbsv1.ClaimActualLRPResponse, []error, error) {
			items := make([]*bbsv1.ClaimActualLRPRequest, len(reqs))
			for i, r := range reqs {
				items[i] = r.CloneVT()
				items[i].Trace = traces[i]
			}
			resp, err := c.bbs.ClaimActualLRPs(ctx, &bbsv1.ClaimActualLRPsRequest{Claims: items})
			if err != nil {
				return nil, nil, err
			}
			out, errs := make([]*bbsv1.ClaimActualLRPResponse, len(resp.GetResults())), make([]error, len(resp.GetResults()))
			// The BBS sends each desired LRP once per batch: the other claims of its
			// instances get the same one.
			desired := map[string]*modelsv1.DesiredLRP{}
			for _, res := range resp.GetResults() {
				if d := res.GetResponse().GetDesiredLrp(); d != nil {
					desired[d.GetProcessGuid()] = d
				}
			}
			for i, res := range resp.GetResults() {
				out[i], errs[i] = res.GetResponse(), batchError(res.GetError())
				if errs[i] == nil && out[i] != nil && out[i].GetDesiredLrp() == nil && i < len(reqs) && reqs[i].GetIncludeDesiredLrp() {
					out[i].DesiredLrp = desired[reqs[i].GetProcessGuid()]
				}
			}
			return out, errs, nil
		},
	}
	c.starts = &batcher[*bbsv1.StartActualLRPRequest, *bbsv1.StartActualLRPResponse]{
		base: c.base, callTimeout: c.cfg.CallTimeout,
		one: func(ctx context.Context, r *bbsv1.StartActualLRPRequest) (*bbsv1.StartActualLRPResponse, error) {
			return c.bbs.StartActualLRP(ctx, r)
		},
		many: func(ctx context.Context, reqs []*bbsv1.StartActualLRPRequest, traces []*modelsv1.TraceContext) ([]*bbsv1.StartActualLRPResponse, []error, error) {
			items := make([]*bbsv1.StartActualLRPRequest, len(reqs))
			for i, r := range reqs {
				items[i] = r.CloneVT()
				items[i].Trace = traces[i]
			}
			resp, err := c.bbs.StartActualLRPs(ctx, &bbsv1.StartActualLRPsRequest{Starts: items})
			if err != nil {
				return nil, nil, err
			}
			out, errs := make([]*bbsv1.StartActualLRPResponse, len(resp.GetResults())), make([]error, len(resp.GetResults()))
			for i, res := range resp.GetResults() {
				out[i], errs[i] = res.GetResponse(), batchError(res.GetError())
			}
			return out, errs, nil
		},
	}
}
