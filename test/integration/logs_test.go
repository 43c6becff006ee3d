package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/devcluster"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
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

	missing, err := c.BBS.StreamLogs(ctx, &bbsv1.StreamLogsRequest{ProcessGuid: "nope"})
	if err == nil {
		_, err = missing.Recv()
	}
	if status.Code(err) != codes.NotFound {
		t.Fatalf("logs of an unknown LRP: %v, want NotFound", err)
	}
}
