package routeemitter

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
)

// Reporting to the BBS (docs/decisions/0022-drain-first-stops.md): before it stops an
// instance it has withdrawn from routing, the BBS waits (up to its drain_timeout) until every
// route-emitter has published the revision that withdrew it. The route-emitter tells it with
// ReportRoutesPublished: as soon as its published revision moves (at most every
// minReportInterval), and every heartbeatInterval to keep its report's lease alive.
const (
	// minReportInterval bounds the report rate: at most one report per interval.
	minReportInterval = 50 * time.Millisecond
	// heartbeatInterval renews the report (its lease at the BBS lasts 10 s).
	heartbeatInterval = 3 * time.Second
)

// reportBBS is the BBS call the reporter makes.
type reportBBS interface {
	ReportRoutesPublished(ctx context.Context, in *bbsv1.ReportRoutesPublishedRequest, opts ...grpc.CallOption) (*bbsv1.ReportRoutesPublishedResponse, error)
}

// published is what the reporter reads from the syncer.
type published interface {
	Published() int64
	Advanced() <-chan struct{}
}

// reporter sends the published revision to the BBS.
type reporter struct {
	bbs reportBBS
	src published
	id  string
	log hclog.Logger
}

// run reports until ctx ends. A failed report is logged and retried at the next signal or
// heartbeat; a BBS that never hears from this route-emitter stops waiting after its drain
// timeout.
func (r *reporter) run(ctx context.Context) error {
	heartbeat := time.NewTicker(heartbeatInterval)
	defer heartbeat.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.src.Advanced():
		case <-heartbeat.C:
		}
		if wait := minReportInterval - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		rev := r.src.Published()
		if rev == 0 {
			continue // not synced yet: nothing published
		}
		last = time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := r.bbs.ReportRoutesPublished(cctx, &bbsv1.ReportRoutesPublishedRequest{EmitterId: r.id, Revision: rev})
		cancel()
		if err != nil && ctx.Err() == nil {
			r.log.Warn("reporting the published revision to the BBS failed; drains there wait for their timeout", "revision", rev, "error", err)
		}
	}
}
