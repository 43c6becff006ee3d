package placement

import (
	"slices"
	"testing"
)

// TestConstraintProposalTable checks every constraint of the placement pools proposal against
// its nine-cell tag table.
func TestConstraintProposalTable(t *testing.T) {
	tests := []struct {
		name              string
		require, disallow []string
		want              []int
	}{
		{"empty constraint", nil, nil, []int{1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"require staging", []string{"staging"}, nil, []int{1, 2, 3, 4}},
		{"disallow production", nil, []string{"production"}, []int{1, 2, 3, 4, 9}},
		{"require staging and skynet", []string{"staging", "skynet"}, nil, []int{1, 2}},
		{"require staging, disallow skynet", []string{"staging"}, []string{"skynet"}, []int{3, 4}},
		{"require and disallow staging", []string{"staging"}, []string{"staging"}, []int{}},
		{"require alfalfa", []string{"alfalfa"}, nil, []int{}},
		{"case-insensitive require", []string{"STAGING", "SkyNet"}, nil, []int{1, 2}},
		{"case-insensitive disallow", nil, []string{"Production"}, []int{1, 2, 3, 4, 9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := lrpWork("web", 0, 64)
			w.Require, w.Disallow = tc.require, tc.disallow
			if got := ids(passing(Constraint{}, w, proposalCells())); !slices.Equal(got, tc.want) {
				t.Fatalf("eligible cells %v, want %v", got, tc.want)
			}
		})
	}
}

func TestConstraintReasons(t *testing.T) {
	c := &Cell{ID: "c", Tags: TagSet("Production", "skynet")}
	w := &Work{Kind: KindTask, TaskGuid: "t", Require: []string{"staging", "STAGING", "gpu", "production"}, Disallow: []string{"SKYNET", "skynet", "legacy"}}
	var got []string
	for _, r := range (Constraint{}).Check(w, c) {
		got = append(got, r.One+" | "+r.Many)
	}
	want := []string{
		`lacks tag "staging" | lack tag "staging"`,
		`lacks tag "gpu" | lack tag "gpu"`,
		`carries disallowed tag "skynet" | carry disallowed tag "skynet"`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("reasons\n%q\nwant\n%q", got, want)
	}
}
