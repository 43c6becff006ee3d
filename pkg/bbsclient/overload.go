package bbsclient

import (
	"context"
	"math/rand/v2"
	"path"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// OverloadAttempts bounds the times RetryOverloaded sends one call (the first included). At
// the BBS's default retry-after of 100 ms that is about 3 s of waiting.
const OverloadAttempts = 20

// Outcomes of a refusal, the outcome label of the refusals counter.
const (
	// OutcomeRetried: the call was sent again after the wait the BBS named.
	OutcomeRetried = "retried"
	// OutcomeReturned: the refusal was returned to the caller (attempts exhausted, or the
	// call's context would end before the wait).
	OutcomeReturned = "returned"
)

// refusals counts, for every BBS connection of the process, the calls a shedding BBS refused.
var refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "gavel", Subsystem: "bbs_client", Name: "overload_refusals_total",
	Help: "Calls the BBS refused as overloaded (ResourceExhausted with a retry-after), by method and outcome: " +
		"retried (sent again after the wait it named) or returned (given to the caller: attempts or deadline exhausted).",
}, []string{"grpc_method", "outcome"})

// Metrics is the process-wide refusals counter of RetryOverloaded
// (gavel_bbs_client_overload_refusals_total{grpc_method,outcome}), shared by every connection
// Dial makes; each service registers it in its own registry.
func Metrics() prometheus.Collector { return refusals }

// Refusals is how many calls of method (its short name, e.g. "DesireLRP"; "" for every
// method) a shedding BBS refused in this process with the given outcome (OutcomeRetried or
// OutcomeReturned), over every connection Dial made.
func Refusals(method, outcome string) int64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(refusals)
	families, err := reg.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if (method == "" || got["grpc_method"] == method) && got["outcome"] == outcome {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int64(n)
}

// RetryOverloaded is the unary client interceptor Dial installs on every BBS connection: it
// honours the BBS's load shedding. A call the BBS refused as overloaded (ResourceExhausted
// carrying a google.rpc.RetryInfo, see rpcerr.Overloaded) is sent again after the wait the
// BBS named, spread over [wait, 2·wait) so that refused callers do not come back together, at
// most OverloadAttempts times in all and never past the call's context: a refusal is returned
// as it is when the attempts are used up or the context would end before the wait does. Any
// other answer, success or error, passes through untouched.
//
// Sending again is safe for every method because the BBS refuses over its admission bound
// before the request reaches a handler: nothing was read for the caller or changed.
//
// Streams are not intercepted: the BBS's admission bound covers unary writes only (event
// streams are never shed), and a stream's status arrives with its first message, after the
// stream has been handed to the caller.
func RetryOverloaded() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			after, shed := rpcerr.RetryAfter(err)
			if !shed {
				return err
			}
			wait := after + rand.N(max(after, time.Millisecond))
			if attempt >= OverloadAttempts || !fits(ctx, wait) {
				refusals.WithLabelValues(path.Base(method), OutcomeReturned).Inc()
				return err
			}
			refusals.WithLabelValues(path.Base(method), OutcomeRetried).Inc()
			if !retry.Sleep(ctx, wait) {
				return err
			}
		}
	}
}

// fits reports whether waiting d leaves ctx time for another call.
func fits(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return ctx.Err() == nil && (!ok || time.Until(deadline) > d)
}
