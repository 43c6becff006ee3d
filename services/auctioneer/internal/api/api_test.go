package api

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

type fakeQueue struct {
	leading bool
	works   []*placement.Work
}

func (q *fakeQueue) Leading() bool                   { return q.leading }
func (q *fakeQueue) Enqueue(works []*placement.Work) { q.works = append(q.works, works...) }

func TestHandlerEnqueuesOnlyWhenLeading(t *testing.T) {
	q := &fakeQueue{}
	s := New(q)
	req := &auctioneerv1.RequestLRPAuctionsRequest{Starts: []*auctioneerv1.LRPStartRequest{{
		ProcessGuid: "web", Domain: "apps", Indices: []int32{0, 2}, Rootfs: "preloaded:cflinuxfs4",
		Resources: &modelsv1.Resources{MemoryMb: 128, DiskMb: 10, MaxPids: 50}, PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{"a"}},
	}}}
	_, err := s.RequestLRPAuctions(context.Background(), req)
	if status.Code(rpcerr.ToStatus(err)) != codes.FailedPrecondition || len(q.works) != 0 {
		t.Fatalf("standby: %v, %d queued", err, len(q.works))
	}
	q.leading = true
	if _, err := s.RequestLRPAuctions(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RequestTaskAuctions(context.Background(), &auctioneerv1.RequestTaskAuctionsRequest{Tasks: []*auctioneerv1.TaskStartRequest{{TaskGuid: "t", Domain: "d", Rootfs: "docker:///x"}}}); err != nil {
		t.Fatal(err)
	}
	if len(q.works) != 3 {
		t.Fatalf("queued %d, want 3", len(q.works))
	}
	w := q.works[1]
	if w.Key() != "lrp/web/2" || w.MemoryMB != 128 || w.DiskMB != 10 || w.MaxPids != 50 || w.Require[0] != "a" || q.works[2].Key() != "task/t" {
		t.Fatalf("work %+v", w)
	}
}

func TestValidate(t *testing.T) {
	good := &auctioneerv1.LRPStartRequest{ProcessGuid: "web", Domain: "apps", Indices: []int32{0}, Rootfs: "preloaded:cflinuxfs4"}
	if err := Validate(&auctioneerv1.RequestLRPAuctionsRequest{Starts: []*auctioneerv1.LRPStartRequest{good}}); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
	bad := &auctioneerv1.LRPStartRequest{Domain: "apps", Indices: []int32{-1}, Rootfs: "cflinuxfs4",
		Resources: &modelsv1.Resources{MemoryMb: -1}}
	err := Validate(&auctioneerv1.RequestLRPAuctionsRequest{Starts: []*auctioneerv1.LRPStartRequest{good, bad}})
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("got %v", err)
	}
	for _, field := range []string{"starts[1].process_guid", "starts[1].indices[0]", "starts[1].rootfs", "starts[1].resources.memory_mb"} {
		if !strings.Contains(st.Message(), field) {
			t.Errorf("message %q does not name %s", st.Message(), field)
		}
	}
	if err := Validate(&auctioneerv1.RequestTaskAuctionsRequest{Tasks: []*auctioneerv1.TaskStartRequest{{TaskGuid: "t", Domain: "d"}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("task without rootfs: %v", err)
	}
}
