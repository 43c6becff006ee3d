package api

import (
	"context"
	"path"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Admission bounds the writes the BBS works on at once. A write that arrives when the bound is
// reached is refused at once with ResourceExhausted and a retry-after (rpcerr.Overloaded),
// instead of queueing until its deadline expires inside an etcd transaction: the caller
// learns early, waits, and tries again, and the writes already admitted keep their pace.
//
// New work (desiring LRPs and tasks, changing instance counts) may hold only half the slots,
// so that under a burst of new work the lifecycle writes of work already placed (claims,
// starts, crashes) still get in and the work in progress keeps moving. Reads are served from
// the cache and are not bounded here.
type Admission struct {
	limit, intakeLimit int64
	retryAfter         time.Duration
	log                hclog.Logger

	inflight, intake atomic.Int64
	refused          atomic.Int64
	lastReport       atomic.Int64 // unix nanos of the last "shedding load" log line
	reported         atomic.Int64 // refusals already logged
}

// reads are the BBS methods that only read the cache.
var reads = map[string]bool{
	"ActualLRPs": true, "DesiredLRPs": true, "DesiredLRPByProcessGuid": true, "DesiredLRPSchedulingInfos": true,
	"Tasks": true, "TaskByGuid": true, "Cells": true, "Tags": true, "Domains": true, "ResolveLinks": true,
}

// intake are the BBS methods that bring new work.
var intake = map[string]bool{"DesireLRP": true, "DesireTask": true, "UpdateDesiredLRP": true}

// NewAdmission bounds writes to limit at once (new work to half of it) and tells refused
// callers to wait retryAfter. A limit of zero or less admits everything.
func NewAdmission(limit int, retryAfter time.Duration, logger hclog.Logger) *Admission {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Admission{limit: int64(limit), intakeLimit: max(1, int64(limit)/2), retryAfter: retryAfter, log: logger}
}

// Refused is how many calls were refused so far.
func (a *Admission) Refused() int64 { return a.refused.Load() }

// UnaryServerInterceptor applies the bound to unary calls.
func (a *Admission) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := path.Base(info.FullMethod)
		if a.limit <= 0 || reads[method] {
			return handler(ctx, req)
		}
		isIntake := intake[method]
		if isIntake {
			if a.intake.Add(1) > a.intakeLimit {
				a.intake.Add(-1)
				return nil, a.refuse(method, "new work")
			}
			defer a.intake.Add(-1)
		}
		w := min(weight(req), a.limit)
		if a.inflight.Add(w) > a.limit {
			a.inflight.Add(-w)
			return nil, a.refuse(method, "writes")
		}
		defer a.inflight.Add(-w)
		return handler(ctx, req)
	}
}

// refuse counts a refusal, logs a summary at most once a second, and builds the answer.
func (a *Admission) refuse(method, what string) error {
	n := a.refused.Add(1)
	now := time.Now().UnixNano()
	if last := a.lastReport.Load(); now-last >= int64(time.Second) && a.lastReport.CompareAndSwap(last, now) {
		a.log.Info("shedding load: calls refused with ResourceExhausted", "refused", n-a.reported.Swap(n), "limit", a.limit)
	}
	limit := a.limit
	if what == "new work" {
		limit = a.intakeLimit
	}
	return rpcerr.Overloaded(a.retryAfter, "bbs busy: %d %s in flight, %s refused; retry after %s", limit, what, method, a.retryAfter)
}

// weight is how many writes a call brings: one, or a batch call's items (a batch larger than
// the bound counts as the bound, so it can be admitted when nothing else is in flight).
func weight(req any) int64 {
	switch r := req.(type) {
	case *bbsv1.ClaimActualLRPsRequest:
		return max(1, int64(len(r.GetClaims())))
	case *bbsv1.StartActualLRPsRequest:
		return max(1, int64(len(r.GetStarts())))
	}
	return 1
}
