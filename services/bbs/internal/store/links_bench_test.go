package store

import (
	"fmt"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// BenchmarkLinksPerActualChange is the BBS's link cost of one actual-LRP change (an instance of
// a provider going RUNNING or leaving) with 1,000 consumers of that provider watching: the
// tracker re-resolves the 1,000 consumers and emits their LinksChanged events. Consumers of
// 999 other providers are not touched.
func BenchmarkLinksPerActualChange(b *testing.B) {
	const n = 1000
	st := newState()
	for i := 0; i < n; i++ {
		g := fmt.Sprintf("p-%d", i)
		st.set(parsedKey{kind: kindRun, id: g}, item{msg: &modelsv1.DesiredLRPRunInfo{ProcessGuid: g, Domain: "cf", Ports: []uint32{8080},
			Links: &modelsv1.Links{Provides: []*modelsv1.LinkProvide{{Name: fmt.Sprintf("svc-%d", i), Type: fmt.Sprintf("t-%d", i), Port: 8080}}}}})
		c := fmt.Sprintf("c-%d", i)
		st.set(parsedKey{kind: kindRun, id: c}, item{msg: &modelsv1.DesiredLRPRunInfo{ProcessGuid: c, Domain: "cf",
			Links: &modelsv1.Links{Consumes: []*modelsv1.LinkConsume{{Name: "hot", From: "svc-0"}, {Name: "own", Type: fmt.Sprintf("t-%d", i)}}}}})
	}
	actual := func(idx int32, s modelsv1.ActualLRP_State) *modelsv1.ActualLRP {
		return &modelsv1.ActualLRP{
			Key:         &modelsv1.ActualLRPKey{ProcessGuid: "p-0", Index: idx, Domain: "cf"},
			InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: fmt.Sprintf("i-%d", idx), CellId: "cell-1"},
			State:       s, Presence: modelsv1.ActualLRP_PRESENCE_ORDINARY,
			NetInfo: &modelsv1.ActualLRPNetInfo{Address: "10.0.0.1", Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: uint32(60000 + idx)}}},
		}
	}
	for i := int32(0); i < 3; i++ {
		st.set(parsedKey{kind: kindActual, id: "p-0", index: i, presence: modelsv1.ActualLRP_PRESENCE_ORDINARY}, item{msg: actual(i, modelsv1.ActualLRP_STATE_RUNNING)})
	}
	lt := newLinkTracker()
	lt.reset(st)
	k := parsedKey{kind: kindActual, id: "p-0", index: 3, presence: modelsv1.ActualLRP_PRESENCE_ORDINARY}
	var prev *modelsv1.ActualLRP
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := modelsv1.ActualLRP_STATE_RUNNING
		if i%2 == 1 {
			s = modelsv1.ActualLRP_STATE_CRASHED
		}
		a := actual(3, s)
		st.set(k, item{msg: a})
		c := change{key: k, after: a}
		if prev != nil {
			c.before = prev
		}
		prev = a
		if evs := lt.apply(st, []change{c}); len(evs) != n {
			b.Fatalf("%d LinksChanged events, want %d", len(evs), n)
		}
	}
}
