package placement

import (
	"slices"
	"testing"
)

func TestOrder(t *testing.T) {
	work := []*Work{
		lrpWork("small", 1, 64),
		taskWork("t-small", 32),
		lrpWork("big", 2, 1024),
		lrpWork("small", 0, 64),
		taskWork("t-big", 512),
		lrpWork("big", 0, 1024),
		lrpWork("big", 1, 1024),
		lrpWork("mid", 0, 256),
	}
	Order(work)
	var got []string
	for _, w := range work {
		got = append(got, w.String())
	}
	want := []string{
		"lrp big/0", "lrp mid/0", "lrp small/0", // index 0 first, larger memory first
		"task t-big", "task t-small", // then tasks
		"lrp big/1", "lrp big/2", "lrp small/1", // then the rest
	}
	if !slices.Equal(got, want) {
		t.Fatalf("order\n%v\nwant\n%v", got, want)
	}
}

func TestInFlight(t *testing.T) {
	unlimited := InFlight{Starting: 1000}
	if f := unlimited.Admit(); f != nil {
		t.Fatalf("unlimited refused: %v", f)
	}
	f := InFlight{Limit: 2, Starting: 1}
	if fail := f.Admit(); fail != nil {
		t.Fatalf("refused below the limit: %v", fail)
	}
	f.Add(1)
	fail := f.Admit()
	if fail == nil || fail.Code.String() != "CODE_IN_FLIGHT_LIMIT" || fail.Message != "in-flight limit reached: 2 containers starting (limit 2)" {
		t.Fatalf("at the limit: %v", fail)
	}
}

func TestWorkKey(t *testing.T) {
	if k := lrpWork("web", 3, 1).Key(); k != "lrp/web/3" {
		t.Fatal(k)
	}
	if k := taskWork("t1", 1).Key(); k != "task/t1" {
		t.Fatal(k)
	}
}
