package testkit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// RolloutSampler watches an nsync app's instances (every version, `<guid>-v<n>` in the
// cf-apps domain) at the BBS while a deployment runs: it lists them once, then follows the
// BBS's event stream from that revision, so that it sees the instances after every store
// revision (every step of the rollout, however short), and records, per revision, the ready
// instances of all versions and the zone counts of the running ones. Read its fields after End.
type RolloutSampler struct {
	t  *testing.T
	mu sync.Mutex
	// MinReady is the fewest running, routable instances of any version at one revision.
	MinReady int
	// MaxPresent is the most instance records of any version at one revision.
	MaxPresent int
	// MaxSkewNew is the largest zone skew of the new version's running instances.
	MaxSkewNew int
	// MaxSkewAll is the largest zone skew of every running instance of the app.
	MaxSkewAll int
	// WorstAll describes the revision of MaxSkewAll.
	WorstAll string
	// Samples is how many revisions were observed.
	Samples int
	// NewRunning holds every count of running new instances seen at a revision.
	NewRunning  map[int]bool
	err         error // the event stream broke before end
	stop        context.CancelFunc
	done        chan struct{}
	guid, newPG string
	zone        map[string]string
}

// SampleRollout starts a RolloutSampler of app guid whose new version's LRP is newPG. The zones
// skew is counted over are those of the cells the BBS lists at the start.
func SampleRollout(t *testing.T, bbs bbsv1.BBSServiceClient, guid, newPG string) *RolloutSampler {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cells, err := bbs.Cells(ctx, &bbsv1.CellsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s := &RolloutSampler{t: t, MinReady: 1 << 30, stop: cancel, done: make(chan struct{}), zone: map[string]string{},
		guid: guid, newPG: newPG, NewRunning: map[int]bool{}}
	for _, c := range cells.GetCells() {
		s.zone[c.GetCellId()] = c.GetZone()
	}
	filter := &bbsv1.Filter{Domain: "cf-apps"}
	list, err := bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := bbs.SubscribeToEvents(ctx, &bbsv1.SubscribeToEventsRequest{SinceRevision: list.GetRevision(), Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	key := func(a *modelsv1.ActualLRP) string {
		return fmt.Sprintf("%s/%d/%d", a.GetKey().GetProcessGuid(), a.GetKey().GetIndex(), a.GetPresence())
	}
	state := map[string]*modelsv1.ActualLRP{}
	for _, a := range list.GetActualLrps() {
		state[key(a)] = a
	}
	s.observe(state, list.GetRevision())
	go func() {
		defer close(s.done)
		for {
			msg, err := stream.Recv()
			if err != nil {
				if ctx.Err() == nil {
					s.mu.Lock()
					s.err = err
					s.mu.Unlock()
				}
				return
			}
			if msg.GetBookmark() {
				continue
			}
			for _, ev := range msg.GetEvents() {
				switch {
				case ev.GetActualLrpCreated() != nil:
					a := ev.GetActualLrpCreated().GetActualLrp()
					state[key(a)] = a
				case ev.GetActualLrpChanged() != nil:
					delete(state, key(ev.GetActualLrpChanged().GetBefore()))
					a := ev.GetActualLrpChanged().GetAfter()
					state[key(a)] = a
				case ev.GetActualLrpRemoved() != nil:
					delete(state, key(ev.GetActualLrpRemoved().GetActualLrp()))
				}
			}
			s.observe(state, msg.GetRevision())
		}
	}()
	return s
}

// observe records one sample: the app's instances as of store revision rev.
func (s *RolloutSampler) observe(state map[string]*modelsv1.ActualLRP, rev int64) {
	ready, present, NewRunning := 0, 0, 0
	all, fresh := map[string]int{}, map[string]int{}
	for _, z := range s.zone {
		all[z], fresh[z] = 0, 0
	}
	for _, a := range state {
		if !strings.HasPrefix(a.GetKey().GetProcessGuid(), s.guid+"-v") {
			continue
		}
		present++
		if a.GetState() != modelsv1.ActualLRP_STATE_RUNNING {
			continue
		}
		z := s.zone[a.GetInstanceKey().GetCellId()]
		all[z]++
		if a.GetKey().GetProcessGuid() == s.newPG {
			fresh[z]++
			NewRunning++
		}
		if a.GetRoutable() {
			ready++
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Samples++
	s.NewRunning[NewRunning] = true
	s.MinReady, s.MaxPresent = min(s.MinReady, ready), max(s.MaxPresent, present)
	s.MaxSkewNew = max(s.MaxSkewNew, zoneSkew(fresh))
	if k := zoneSkew(all); k > s.MaxSkewAll {
		s.MaxSkewAll, s.WorstAll = k, fmt.Sprintf("revision %d: every instance %v, the new version %v", rev, all, fresh)
	}
}

// zoneSkew is the difference between the largest and the smallest count of m.
func zoneSkew(m map[string]int) int {
	lo, hi := 1<<30, 0
	for _, n := range m {
		lo, hi = min(lo, n), max(hi, n)
	}
	return hi - lo
}

// End stops the sampler; a sampler whose event stream broke fails the test (it missed steps).
func (s *RolloutSampler) End() *RolloutSampler {
	s.t.Helper()
	s.stop()
	<-s.done
	if s.err != nil {
		s.t.Errorf("the sampler's event stream broke after %d Samples: %v", s.Samples, s.err)
	}
	return s
}
