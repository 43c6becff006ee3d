package integration

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/rep"
)

// TestStartReportSurvivesAnOutage: the path by which reps report a started instance fails for
// a while (the BBS unavailable, then busy and shedding load), far longer than one call's
// retries; the bulk reconcile is an hour away. Every instance must still reach RUNNING once
// the path heals: a rep that cannot report a start keeps trying.
func TestStartReportSurvivesAnOutage(t *testing.T) {
	const instances = 6
	// callAttempts is the rep's budget of failed attempts for one ordinary BBS call
	// (services/rep/internal/cell).
	const callAttempts = 5
	var failing atomic.Bool
	var refused [instances]atomic.Int64 // refused start reports, by instance index
	failing.Store(true)
	// Each instance's refusals alternate between a BBS that is down and one that sheds load.
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		// A report goes alone (StartActualLRP) or with others that queued behind it
		// (StartActualLRPs); a refused batch is a refusal of each of its reports.
		var indexes []int32
		switch r := req.(type) {
		case *bbsv1.StartActualLRPRequest:
			indexes = []int32{r.GetIndex()}
		case *bbsv1.StartActualLRPsRequest:
			for _, st := range r.GetStarts() {
				indexes = append(indexes, st.GetIndex())
			}
		}
		if failing.Load() && len(indexes) > 0 {
			busy := false
			for _, i := range indexes {
				busy = refused[i].Add(1)%2 == 0
			}
			if busy {
				return rpcerr.Overloaded(50*time.Millisecond, "bbs busy (injected)")
			}
			return status.Error(codes.Unavailable, "bbs down (injected)")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	// unavailable is the fewest Unavailable refusals any instance's report has had.
	unavailable := func() int64 {
		least := int64(-1)
		for i := range refused {
			if n := (refused[i].Load() + 1) / 2; least < 0 || n < least {
				least = n
			}
		}
		return least
	}
	var cells []devcluster.Cell
	for _, id := range []string{"cell-a", "cell-b"} {
		c := simCell(id, "z1", nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)
		c.Config.BulkInterval = rep.Duration(time.Hour)
		cells = append(cells, c)
	}
	c := startClusterWith(t, devcluster.Config{Cells: cells, RepBBSInterceptor: intercept})
	ctx := context.Background()
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: desiredLRP("outage", "preloaded:cflinuxfs4", instances, nil)}); err != nil {
		t.Fatal(err)
	}
	count := func(state modelsv1.ActualLRP_State) int {
		n := 0
		for _, a := range actualLRPs(t, c, "outage") {
			if a.GetState() == state {
				n++
			}
		}
		return n
	}
	// Every instance is claimed and its container healthy, but none can be reported.
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		claimed := count(modelsv1.ActualLRP_STATE_CLAIMED)
		return claimed == instances && unavailable() >= 1, "claimed " + strconv.Itoa(claimed) + ", fewest refusals " + strconv.Itoa(int(unavailable()))
	}, "every instance claimed and its start refused")
	// The outage outlasts a call's attempts: every report is refused as Unavailable more often
	// than an ordinary call would try (each refusal is an attempt the rep made, so these arrive
	// only if it keeps trying), and every instance is still CLAIMED, not given up on.
	testkit.EventuallyState(t, 60*time.Second, func() (bool, string) {
		return unavailable() > callAttempts, "fewest Unavailable refusals of an instance's report: " + strconv.Itoa(int(unavailable()))
	}, "every report refused more often than a call's attempts")
	if claimed := count(modelsv1.ActualLRP_STATE_CLAIMED); claimed != instances {
		t.Fatalf("%d of %d instances CLAIMED during the outage", claimed, instances)
	}
	failing.Store(false)
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		running := count(modelsv1.ActualLRP_STATE_RUNNING)
		return running == instances, strconv.Itoa(running) + " running"
	}, "every instance RUNNING after the outage")
}
