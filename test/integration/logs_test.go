package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/services/rep"
)

// TestLogsThroughTheBBS follows an LRP's logs through the BBS, which proxies them from the
// cells holding its instances: lines of both instances (on two cells) arrive while following,
// a tail of one instance is exactly that many lines, and an unknown LRP is NotFound.
func TestLogsThroughTheBBS(t *testing.T) {
	var cells []devcluster.Cell
	for i := range 2 {
		c := simCell(fmt.Sprintf("cell-%d", i), fmt.Sprintf("z%d", i), nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)
		c.Config.Sim.LogInterval = rep.Duration(50 * time.Millisecond)
		cells = append(cells, c)
	}
	c := startCluster(t, cells)
	ctx := t.Context()
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: desiredLRP("web", "preloaded:cflinuxfs4", 2, nil)}); err != nil {
		t.Fatal(err)
	}
	waitFor := time.Now().Add(30 * time.Second)
	for {
		as := actualLRPs(t, c, "web")
		running := 0
		for _, a := range as {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
				running++
			}
		}
		if running == 2 {
			break
		}
		if time.Now().After(waitFor) {
			t.Fatalf("web not running on both cells: %v", as)
		}
		time.Sleep(50 * time.Millisecond)
	}

	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	zero := int32(0)
	follow, err := c.BBS.StreamLogs(fctx, &bbsv1.StreamLogsRequest{ProcessGuid: "web", Tail: &zero, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	cellsSeen := map[string]bool{}
	for len(seen) < 2 {
		msg, err := follow.Recv()
		if err != nil {
			t.Fatalf("following web's logs: %v (instances seen %v)", err, seen)
		}
		for _, l := range msg.GetLines() {
			seen[l.GetIndex()] = true
		}
		cellsSeen[msg.GetCellId()] = true
	}
	cancel()

	one := int32(0)
	three := int32(3)
	tail, err := c.BBS.StreamLogs(ctx, &bbsv1.StreamLogsRequest{ProcessGuid: "web", Index: &one, Tail: &three})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		msg, err := tail.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range msg.GetLines() {
			if l.GetIndex() != 0 {
				t.Errorf("tail of index 0 holds a line of index %d", l.GetIndex())
			}
			n++
		}
	}
	if n != 3 {
		t.Fatalf("tail 3 of web/0: %d lines", n)
	}

	// A tail of the whole LRP is exactly that many lines over both cells, in time order; with
	// follow, the new lines come after them, none twice.
	five := int32(5)
	merged, err := c.BBS.StreamLogs(ctx, &bbsv1.StreamLogsRequest{ProcessGuid: "web", Tail: &five})
	if err != nil {
		t.Fatal(err)
	}
	var got []*repv1.LogLine
	for {
		msg, err := merged.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, msg.GetLines()...)
	}
	if len(got) != 5 || !inTimeOrder(got) {
		t.Fatalf("tail 5 of web over 2 cells: %d lines %v, want 5 in time order", len(got), got)
	}
	four := int32(4)
	fctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	follow, err = c.BBS.StreamLogs(fctx, &bbsv1.StreamLogsRequest{ProcessGuid: "web", Tail: &four, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	seenIdx := map[int32]int{}
	for len(seenIdx) < 2 || seenIdx[0] < 8 || seenIdx[1] < 8 {
		msg, err := follow.Recv()
		if err != nil {
			t.Fatalf("following web with tail 4: %v after %d lines", err, len(got))
		}
		got = append(got, msg.GetLines()...)
		for _, l := range msg.GetLines() {
			seenIdx[l.GetIndex()]++
		}
	}
	cancel()
	type key struct {
		instance, text string
		at             time.Time
	}
	once := map[key]bool{}
	for _, l := range got {
		k := key{l.GetInstanceGuid(), l.GetText(), l.GetTimestamp().AsTime()}
		if once[k] {
			t.Fatalf("following web with tail 4: line %v came twice", l)
		}
		once[k] = true
	}
	if !inTimeOrder(got[:4]) {
		t.Fatalf("following web with tail 4: the first 4 lines are not in time order: %v", got[:4])
	}

	missing, err := c.BBS.StreamLogs(ctx, &bbsv1.StreamLogsRequest{ProcessGuid: "nope"})
	if err == nil {
		_, err = missing.Recv()
	}
	if status.Code(err) != codes.NotFound {
		t.Fatalf("logs of an unknown LRP: %v, want NotFound", err)
	}
}

// TestLogsFollowAnInstanceThatMoves follows an LRP's logs through the BBS while its only
// instance's cell evacuates: the replacement on the other cell is picked up by the same stream
// (its lines, with the new instance guid and cell, follow the old ones).
func TestLogsFollowAnInstanceThatMoves(t *testing.T) {
	var cells []devcluster.Cell
	for i := range 2 {
		c := simCell(fmt.Sprintf("cell-%d", i), fmt.Sprintf("z%d", i), nil, map[string]string{"cflinuxfs4": "/rootfs"}, nil)
		c.Config.Sim.LogInterval = rep.Duration(50 * time.Millisecond)
		cells = append(cells, c)
	}
	c := startCluster(t, cells)
	ctx := t.Context()
	if _, err := c.BBS.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: desiredLRP("web", "preloaded:cflinuxfs4", 1, nil)}); err != nil {
		t.Fatal(err)
	}
	var first *modelsv1.ActualLRP
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		as := actualLRPs(t, c, "web")
		if len(as) == 1 && as[0].GetState() == modelsv1.ActualLRP_STATE_RUNNING {
			first = as[0]
			return true, ""
		}
		return false, fmt.Sprint(as)
	}, "web running")
	zero := int32(0)
	follow, err := c.BBS.StreamLogs(ctx, &bbsv1.StreamLogsRequest{ProcessGuid: "web", Tail: &zero, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	type seen struct{ cell, instance string }
	var (
		mu     sync.Mutex
		got    = map[seen]bool{}
		ended  error
		closed = make(chan struct{})
	)
	go func() {
		defer close(closed)
		for {
			msg, err := follow.Recv()
			if err != nil {
				mu.Lock()
				ended = err
				mu.Unlock()
				return
			}
			mu.Lock()
			for _, l := range msg.GetLines() {
				got[seen{msg.GetCellId(), l.GetInstanceGuid()}] = true
			}
			mu.Unlock()
		}
	}()
	old := seen{first.GetInstanceKey().GetCellId(), first.GetInstanceKey().GetInstanceGuid()}
	state := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("seen %v, stream ended: %v", got, ended)
	}
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return got[old], ""
	}, "lines of the first instance")

	presences, err := c.BBS.Cells(ctx, &bbsv1.CellsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var evacuating *rep.Service
	for _, p := range presences.GetCells() {
		for _, r := range c.Reps {
			if p.GetCellId() == old.cell && p.GetRepAddress() == r.AdvertiseAddress() {
				evacuating = r
			}
		}
	}
	if evacuating == nil {
		t.Fatalf("no rep for %s among %v", old.cell, presences.GetCells())
	}
	go func() { _ = evacuating.Evacuate(ctx) }()
	testkit.EventuallyState(t, 30*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		for s := range got {
			if s.cell != old.cell && s.instance != old.instance {
				return true, ""
			}
		}
		return false, ""
	}, "lines of the replacement on the other cell, on the same stream")
	select {
	case <-closed:
		t.Fatalf("the follow ended: %s", state())
	default:
	}
}

// inTimeOrder reports whether lines are in the order of their timestamps.
func inTimeOrder(lines []*repv1.LogLine) bool {
	for i := 1; i < len(lines); i++ {
		if lines[i].GetTimestamp().AsTime().Before(lines[i-1].GetTimestamp().AsTime()) {
			return false
		}
	}
	return true
}
