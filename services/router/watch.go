package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/retry"
)

// maxBatch bounds how many already-received messages are folded into one table swap.
const maxBatch = 256

// watcher follows the route-emitter's WatchRoutes stream into the router's table.
type watcher struct {
	client     routeemitterv1.RouteEmitterServiceClient
	log        hclog.Logger
	minBackoff time.Duration
	maxBackoff time.Duration
	// publish installs a new table; it is called from the watcher's goroutine only.
	publish func(*table)
	// current returns the published table (nil before the first snapshot).
	current func() *table
	// onReconnect is called once per failed or ended stream.
	onReconnect func()
}

// run watches until ctx ends: it resumes from the held table_id/version after a stream
// fails, waiting a jittered backoff that doubles per consecutive failure (reset once a
// stream delivers a message) up to maxBackoff. The last table keeps serving meanwhile.
func (w *watcher) run(ctx context.Context) error {
	// Each wait is spread over [d/2, d] of its un-jittered value d (minBackoff doubling up to
	// maxBackoff), so routers do not reconnect in lockstep and maxBackoff stays the longest.
	wait := retry.Policy{Initial: w.minBackoff * 3 / 4, Max: w.maxBackoff * 3 / 4, Jitter: 1.0 / 3}.BackOff()
	resync := false
	for ctx.Err() == nil {
		received, err := w.watchOnce(ctx, resync)
		if ctx.Err() != nil {
			return nil
		}
		resync = errors.Is(err, errResync)
		if received {
			wait.Reset()
		}
		w.onReconnect()
		next := wait.NextBackOff()
		id, version := "", uint64(0)
		if cur := w.current(); cur != nil {
			id, version = cur.id, cur.version
		}
		w.log.Warn("route-emitter stream ended; retrying (the held table keeps serving)", "error", err, "retry_in", next,
			"table_id", id, "version", version)
		if !retry.Sleep(ctx, next) {
			return nil
		}
	}
	return nil
}

// watchOnce runs one WatchRoutes stream until it fails. It resumes from the published
// table unless resync is set (the last stream sent a delta that did not fit), in which case
// it asks for a snapshot. received reports whether any message arrived.
//
// A goroutine receives into a buffered channel so that messages that arrive faster than
// tables are swapped are applied as one batch: one copy of the changed maps per batch.
func (w *watcher) watchOnce(ctx context.Context, resync bool) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &routeemitterv1.WatchRoutesRequest{}
	if cur := w.current(); cur != nil && !resync {
		req.TableId, req.SinceVersion = cur.id, cur.version
	}
	stream, err := w.client.WatchRoutes(ctx, req)
	if err != nil {
		return false, fmt.Errorf("watch routes: %w", err)
	}
	w.log.Debug("watching routes", "table_id", req.TableId, "since_version", req.SinceVersion)

	msgs := make(chan *routeemitterv1.WatchRoutesResponse, maxBatch)
	var recvErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr = err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				recvErr = ctx.Err()
				return
			}
		}
	}()
	defer wg.Wait()
	defer cancel()

	for {
		m, ok := <-msgs
		if !ok {
			wg.Wait()
			return received, fmt.Errorf("watch routes: receive: %w", recvErr)
		}
		received = true
		b := newBuilder(w.current())
		err := b.apply(m)
		for n := 1; err == nil && n < maxBatch; n++ {
			var more *routeemitterv1.WatchRoutesResponse
			select {
			case more, ok = <-msgs:
			default:
			}
			if more == nil {
				break
			}
			err = b.apply(more)
		}
		if err != nil {
			return received, fmt.Errorf("watch routes: %w", err)
		}
		if b.skipped > 0 {
			w.log.Warn("ignored malformed routes", "count", b.skipped)
		}
		if t := b.result(); t != nil && t != w.current() {
			w.publish(t)
		}
	}
}
