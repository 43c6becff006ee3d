package table

import (
	"fmt"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// listing is what a full listing of the BBS decodes into: lrps desired LRPs of perLRP running
// instances each, every one with one HTTP route; each call returns new records, as a decoded
// listing does.
func listing(lrps, perLRP int) ([]*modelsv1.DesiredLRPSchedulingInfo, []*modelsv1.ActualLRP) {
	infos := make([]*modelsv1.DesiredLRPSchedulingInfo, 0, lrps)
	actuals := make([]*modelsv1.ActualLRP, 0, lrps*perLRP)
	for l := range lrps {
		guid := fmt.Sprintf("lrp-%06d", l)
		infos = append(infos, &modelsv1.DesiredLRPSchedulingInfo{ProcessGuid: guid,
			Routes: routes(fmt.Sprintf(`[{"port":8080,"routes":["%s.apps.local"]}]`, guid))})
		for i := range perLRP {
			actuals = append(actuals, actual(guid, int32(i), fmt.Sprintf("%s-%d", guid, i), modelsv1.ActualLRP_PRESENCE_ORDINARY, 8080))
		}
	}
	return infos, actuals
}

// BenchmarkReplaceUnchanged measures the event loop's part of a periodic sync at the scale
// run's 1,000-cell size (10,000 LRPs of 10 instances): replacing every input with a listing
// equal to what the table holds, and the commit that follows (an empty delta). The route-emitter
// does this between two events; indexing the listing (NewListing) happens beside the loop, and is
// not counted.
func BenchmarkReplaceUnchanged(b *testing.B) {
	t := New(nil)
	infos, actuals := listing(10_000, 10)
	t.Replace(NewListing(infos, actuals))
	t.Commit()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		infos, actuals := listing(10_000, 10)
		grouped := NewListing(infos, actuals)
		b.StartTimer()
		t.Replace(grouped)
		if d := t.Commit(); !d.Empty() {
			b.Fatalf("an unchanged listing changed %d routes", len(d.Upserts)+len(d.Removals))
		}
	}
}

// BenchmarkCommitAStart measures the event loop's part of one instance starting at the scale
// run's 1,000-cell size (10,000 LRPs of 10 instances): its record replaced by one with another
// instance on the same slot, and the commit that recomputes its process's route and compares it
// with the route held.
func BenchmarkCommitAStart(b *testing.B) {
	t := New(nil)
	infos, actuals := listing(10_000, 10)
	t.Replace(NewListing(infos, actuals))
	t.Commit()
	i := 0
	for b.Loop() {
		guid := fmt.Sprintf("lrp-%06d", i%10_000)
		t.SetActual(actual(guid, int32(i%10), fmt.Sprintf("%s-%d-%d", guid, i%10, i), modelsv1.ActualLRP_PRESENCE_ORDINARY, 8080))
		if d := t.Commit(); len(d.Upserts) != 1 {
			b.Fatalf("a start changed %d routes, want 1", len(d.Upserts))
		}
		i++
	}
}
