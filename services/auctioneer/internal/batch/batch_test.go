package batch

import (
	"slices"
	"testing"

	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

func lrp(guid string, index int32, memory int) *placement.Work {
	return &placement.Work{Kind: placement.KindLRP, ProcessGuid: guid, Index: index, MemoryMB: memory}
}

func keys(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Work.Key())
	}
	return out
}

func TestBatchDedupes(t *testing.T) {
	b := New()
	if n := b.Add(lrp("web", 0, 1), lrp("web", 1, 1), lrp("web", 0, 2)); n != 2 {
		t.Fatalf("added %d, want 2", n)
	}
	task := &placement.Work{Kind: placement.KindTask, TaskGuid: "t1"}
	if n := b.Add(task, &placement.Work{Kind: placement.KindTask, TaskGuid: "t1"}, lrp("web", 1, 3)); n != 1 {
		t.Fatalf("added %d, want 1", n)
	}
	select {
	case <-b.Ready():
	default:
		t.Fatal("not ready after Add")
	}
	got := b.Drain()
	if want := []string{"lrp/web/0", "lrp/web/1", "task/t1"}; !slices.Equal(keys(got), want) {
		t.Fatalf("drained %v, want %v", keys(got), want)
	}
	if got[0].Work.MemoryMB != 2 || got[1].Work.MemoryMB != 3 {
		t.Fatal("the newer request did not replace the older one")
	}
	if b.Len() != 0 || len(b.Drain()) != 0 {
		t.Fatal("batch not empty after Drain")
	}
}

func TestBatchRequeueKeepsNewer(t *testing.T) {
	b := New()
	b.Add(lrp("web", 0, 5))
	b.Requeue([]Entry{{Work: lrp("web", 0, 1), Attempts: 1}, {Work: lrp("web", 1, 1), Attempts: 2}})
	got := b.Drain()
	if len(got) != 2 || got[0].Work.MemoryMB != 5 || got[0].Attempts != 0 || got[1].Attempts != 2 {
		t.Fatalf("after requeue: %+v", got)
	}
	b.Add(lrp("x", 0, 1))
	b.Reset()
	if b.Len() != 0 {
		t.Fatal("Reset left work")
	}
}
