package bbs_test

import (
	"fmt"
	"testing"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// BenchmarkLinksActualChange is the BBS's cost of one actual-LRP change of a provider (an
// instance claimed, then started RUNNING: its nodes change) with 0 and with 1,000 consumer LRPs
// of that provider, over a real fsync'ing etcd: sequential claim+start pairs, timed from the
// first call to the BBS's cache having emitted the last LinksChanged (with consumers). The
// difference between the two is what links add to a change.
func BenchmarkLinksActualChange(b *testing.B) {
	const changesPerOp = 100
	for _, consumers := range []int{0, 1000} {
		b.Run(fmt.Sprintf("consumers=%d", consumers), func(b *testing.B) {
			ctx := benchCtx(b)
			env := startBenchBBS(b)
			clients := dialBBS(b, env.Addr, 1)
			var guids []string
			for i := range consumers {
				guids = append(guids, fmt.Sprintf("consumer-%04d", i))
			}
			reqs := make([]*bbsv1.DesireLRPRequest, len(guids))
			for i, g := range guids {
				d := lrp(g, 0)
				d.Links = &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "db", From: "db"}}}
				reqs[i] = &bbsv1.DesireLRPRequest{DesiredLrp: d}
			}
			var elapsed time.Duration
			b.ResetTimer()
			for it := range b.N {
				b.StopTimer()
				provider := lrp(fmt.Sprintf("db-%d", it), changesPerOp)
				provider.Links = &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: "db", Type: fmt.Sprintf("db-%d", it), Port: 8080}}}
				if it > 0 {
					// One provider named "db" at a time: the previous one goes (forced).
					if _, err := env.Client.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: fmt.Sprintf("db-%d", it-1), Force: true}); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: provider}); err != nil {
					b.Fatal(err)
				}
				if it == 0 {
					if err := parallel(len(reqs), benchWorkers, func(_, i int) error {
						_, err := clients[0].DesireLRP(ctx, reqs[i])
						return err
					}); err != nil {
						b.Fatal(err)
					}
				}
				events, err := env.Client.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := events.Recv(); err != nil { // the stream is live
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				for i := range int32(changesPerOp) {
					guid := provider.GetProcessGuid()
					ik := benchInstanceKey(guid, i)
					if _, err := clients[0].ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: guid, Index: i, InstanceKey: ik}); err != nil {
						b.Fatal(err)
					}
					if _, err := clients[0].StartActualLRP(ctx, &bbsv1.StartActualLRPRequest{ProcessGuid: guid, Index: i, InstanceKey: ik, NetInfo: benchNetInfo, Routable: true}); err != nil {
						b.Fatal(err)
					}
				}
				// Wait for the events of the last change (with consumers, its revision carries
				// their LinksChanged events).
				for done := false; !done; {
					r, err := events.Recv()
					if err != nil {
						b.Fatal(err)
					}
					links := 0
					for _, e := range r.GetEvents() {
						if e.GetLinksChanged() != nil {
							links++
						}
						a := e.GetActualLrpChanged().GetAfter()
						done = done || (a.GetKey().GetIndex() == changesPerOp-1 && a.GetState() == modelsv1.ActualLRP_STATE_RUNNING)
					}
					if done && links != consumers {
						b.Fatalf("the last change carried %d LinksChanged events, want %d", links, consumers)
					}
				}
				elapsed += time.Since(start)
				b.StopTimer()
			}
			b.ReportMetric(float64(elapsed.Microseconds())/float64(changesPerOp*b.N)/1000, "ms/change")
		})
	}
}
