package logs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/services/rep/internal/logs"
)

// startStore runs a store under dir until the test ends.
func startStore(t *testing.T, o logs.Options) *logs.Store {
	t.Helper()
	s, err := logs.New(o)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Start(t, "logs", s)
	return s
}

func waitWritten(t *testing.T, s *logs.Store, n uint64) {
	t.Helper()
	testkit.EventuallyState(t, 5*time.Second, func() (bool, string) {
		return s.Written() >= n, fmt.Sprintf("written %d, dropped %d", s.Written(), s.Dropped())
	}, fmt.Sprintf("%d lines written", n))
}

// TestRotationBoundsTheFiles: a container writing far more than the bound keeps each of its
// two files under it, and the last lines (spanning the rotated and current file) read back in
// order.
func TestRotationBoundsTheFiles(t *testing.T) {
	dir := t.TempDir()
	const max = 8 << 10
	s := startStore(t, logs.Options{Dir: dir, MaxFileBytes: max})
	k := logs.Key{ProcessGuid: "web", Index: 1, InstanceGuid: "i-1"}
	inst, err := s.Open(k, logs.SourceLRP)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	for i := range n {
		inst.Line("", logs.Stdout, fmt.Sprintf("line %04d", i))
		if i%500 == 499 { // stay under the queue's bound: this test is about the files
			waitWritten(t, s, uint64(i+1))
		}
	}
	waitWritten(t, s, n)
	files, _ := filepath.Glob(filepath.Join(dir, "lrp", "web", "1", "i-1", "*"))
	if len(files) != 2 {
		t.Fatalf("files %v, want the current and one rotated", files)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > max {
			t.Errorf("%s is %d bytes, over the bound %d", f, st.Size(), max)
		}
	}
	all, err := s.Read(logs.Filter{ProcessGuid: "web", AnyIndex: true}, time.Time{}, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) >= n || len(all) < 100 {
		t.Fatalf("kept %d lines of %d: rotation should drop the oldest only", len(all), n)
	}
	cur := filepath.Join(dir, "lrp", "web", "1", "i-1", "current.log")
	curLines := 0
	if b, err := os.ReadFile(cur); err == nil {
		for _, c := range b {
			if c == '\n' {
				curLines++
			}
		}
	}
	tail := curLines + 10 // spans both files
	got, err := s.Read(logs.Filter{ProcessGuid: "web", Index: 1}, time.Time{}, tail)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != tail {
		t.Fatalf("tail %d gave %d lines", tail, len(got))
	}
	for i, l := range got {
		if want := fmt.Sprintf("line %04d", n-tail+i); l.Text != want || l.Source != logs.SourceLRP || l.InstanceGuid != "i-1" || l.Index != 1 {
			t.Fatalf("line %d = %+v, want %q from APP/PROC/WEB of i-1", i, l, want)
		}
	}
}

// TestFollowAndRetention: a follower gets the history then the new lines with nothing missed
// or repeated, is told when the container's log closes, and the closed container's files go
// once the retention period has passed (a later store run sweeps them).
func TestFollowAndRetention(t *testing.T) {
	dir := t.TempDir()
	s := startStore(t, logs.Options{Dir: dir, Retention: time.Hour})
	inst, err := s.Open(logs.Key{InstanceGuid: "t-1", TaskGuid: "t-1"}, logs.SourceTaskPrefix+"t-1")
	if err != nil {
		t.Fatal(err)
	}
	f := logs.Filter{TaskGuid: "t-1"}
	inst.Line("", logs.Stdout, "one")
	waitWritten(t, s, 1)
	hist, sub, err := s.Follow(f, time.Time{}, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if len(hist) != 1 || hist[0].Text != "one" || hist[0].Source != "APP/TASK/t-1" {
		t.Fatalf("history %+v", hist)
	}
	inst.Line("", logs.Stderr, "two")
	inst.Close()
	select {
	case got := <-sub.Lines():
		if len(got) != 1 || got[0].Text != "two" || got[0].Stream != logs.Stderr {
			t.Fatalf("live %+v", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no live line")
	}
	select {
	case <-sub.Ended():
	case <-time.After(5 * time.Second):
		t.Fatal("not told of the close")
	}
	if s.OpenFor(f) || !s.Known(f) {
		t.Fatalf("closed log: open %v known %v, want closed and known", s.OpenFor(f), s.Known(f))
	}
	// Age the directory beyond the retention period; a new store's first sweep removes it.
	old := time.Now().Add(-2 * time.Hour)
	for _, p := range []string{"", "current.log"} {
		if err := os.Chtimes(filepath.Join(dir, "task", "t-1", p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	s2 := startStore(t, logs.Options{Dir: dir, Retention: time.Hour})
	testkit.Eventually(t, 5*time.Second, func() bool { return !s2.Known(f) }, "expired log removed")
}

// TestBadKey: a key that is not made of guids is refused, nothing is created outside the store.
func TestBadKey(t *testing.T) {
	s := startStore(t, logs.Options{Dir: t.TempDir()})
	for _, k := range []logs.Key{{ProcessGuid: "..", InstanceGuid: "x"}, {TaskGuid: "a/b"}, {ProcessGuid: "web"}} {
		if _, err := s.Open(k, ""); err == nil {
			t.Errorf("Open(%+v) succeeded", k)
		}
	}
}

// TestWritesNeverBlock: with the writer stalled, lines beyond the queue's bound are dropped
// and counted at once; with the container's directory gone, the disk write fails and its
// lines are dropped and counted while the store goes on.
func TestWritesNeverBlock(t *testing.T) {
	dir := t.TempDir()
	s, err := logs.New(logs.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := s.Open(logs.Key{ProcessGuid: "web", InstanceGuid: "i-1"}, logs.SourceLRP)
	if err != nil {
		t.Fatal(err)
	}
	for range 10000 { // Run has not started: nothing drains the queue
		inst.Line("", logs.Stdout, "x")
	}
	if s.Dropped() == 0 {
		t.Fatal("a full queue dropped nothing")
	}
	queued := 10000 - s.Dropped()
	testkit.Start(t, "logs", s)
	waitWritten(t, s, queued)

	if err := os.RemoveAll(filepath.Join(dir, "lrp", "web", "0", "i-1")); err != nil {
		t.Fatal(err)
	}
	before := s.Dropped()
	inst.Line("", logs.Stdout, "lost")
	testkit.Eventually(t, 5*time.Second, func() bool { return s.Dropped() == before+1 }, "the failed write counted")
	if s.Written() != queued {
		t.Fatalf("written %d, want %d", s.Written(), queued)
	}
}

// TestMemoryStore: with Options.Memory, lines are kept within the same bound without touching
// the disk, read back by filter and tail in order, and followers get the live ones.
func TestMemoryStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	const max = 4 << 10
	s := startStore(t, logs.Options{Dir: dir, MaxFileBytes: max, Memory: true})
	k := logs.Key{ProcessGuid: "web", Index: 0, InstanceGuid: "i-0"}
	inst, err := s.Open(k, logs.SourceLRP)
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Open(logs.Key{ProcessGuid: "db", Index: 0, InstanceGuid: "d-0"}, logs.SourceLRP)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	for i := range n {
		inst.Line("", logs.Stdout, fmt.Sprintf("line %04d", i))
		if i%500 == 499 {
			waitWritten(t, s, uint64(i+1))
		}
	}
	other.Line("", logs.Stdout, "db line")
	waitWritten(t, s, n+1)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the memory store touched the disk: %v", err)
	}
	web := logs.Filter{ProcessGuid: "web", AnyIndex: true}
	all, err := s.Read(web, time.Time{}, -1)
	if err != nil {
		t.Fatal(err)
	}
	if bytes := len(all) * len("line 0000"); bytes > 2*max || all[len(all)-1].Text != "line 1999" {
		t.Fatalf("kept %d lines (%d bytes of text, bound %d), last %q", len(all), bytes, 2*max, all[len(all)-1].Text)
	}
	last, err := s.Read(web, time.Time{}, 3)
	if err != nil || len(last) != 3 || last[0].Text != "line 1997" || last[2].Text != "line 1999" {
		t.Fatalf("tail 3 = %v, %v", last, err)
	}
	if !s.Known(web) || s.Known(logs.Filter{ProcessGuid: "nope", AnyIndex: true}) {
		t.Fatal("Known does not follow the memory logs")
	}
}
