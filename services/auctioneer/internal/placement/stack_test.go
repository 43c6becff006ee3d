package placement

import (
	"slices"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

const (
	codeMismatch      = modelsv1.PlacementError_CODE_CELL_MISMATCH
	codeInsufficient  = modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES
	codeCommunication = modelsv1.PlacementError_CODE_CELL_COMMUNICATION
)

// TestStackPlacesOnlyOnEligibleCells places instances with each satisfiable constraint of the
// proposal: every one lands on a listed cell, and (spread and locality) every listed cell gets
// one before any gets two.
func TestStackPlacesOnlyOnEligibleCells(t *testing.T) {
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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cells := proposalCells()
			s := NewStack()
			used := map[*Cell]bool{}
			for i := range len(tc.want) {
				w := lrpWork("web", int32(i), 64)
				w.Require, w.Disallow = tc.require, tc.disallow
				c, f := s.Select(w, cells, nil)
				if f != nil {
					t.Fatalf("instance %d: %v", i, f)
				}
				if used[c] {
					t.Fatalf("instance %d doubled up on %s before every eligible cell had one", i, c.ID)
				}
				used[c] = true
				c.Reserve(w)
			}
			var got []*Cell
			for c := range used {
				got = append(got, c)
			}
			if ids := ids(got); !slices.Equal(ids, tc.want) {
				t.Fatalf("placed on cells %v, want %v", ids, tc.want)
			}
			// One more instance still goes to an eligible cell.
			w := lrpWork("web", 99, 64)
			w.Require, w.Disallow = tc.require, tc.disallow
			c, f := s.Select(w, cells, nil)
			if f != nil || !slices.Contains(tc.want, ids([]*Cell{c})[0]) {
				t.Fatalf("extra instance on %v (%v)", c, f)
			}
		})
	}
}

func TestStackFailures(t *testing.T) {
	tests := []struct {
		name              string
		cells             func() []*Cell
		rootfs            string
		memory            int
		require, disallow []string
		refused           Refused
		wantCode          modelsv1.PlacementError_Code
		wantMsg           string
	}{
		{
			name: "require and disallow staging", cells: proposalCells, require: []string{"staging"}, disallow: []string{"staging"},
			wantCode: codeMismatch,
			wantMsg:  `found no compatible cell: 0/9 cells eligible (5 lack tag "staging", 4 carry disallowed tag "staging")`,
		},
		{
			name: "require alfalfa", cells: proposalCells, require: []string{"alfalfa"},
			wantCode: codeMismatch,
			wantMsg:  `found no compatible cell: 0/9 cells eligible (9 lack tag "alfalfa")`,
		},
		{
			name: "rootfs and tags (design example)", rootfs: "preloaded:lucid64", require: []string{"staging"},
			cells: func() []*Cell {
				cs := proposalCells()
				for i, c := range cs {
					if i >= 4 {
						c.PreloadedRootfses = NameSet("cflinuxfs4", "lucid64")
					}
				}
				return cs
			},
			wantCode: codeMismatch,
			wantMsg:  `found no compatible cell: 0/9 cells eligible (5 lack tag "staging", 4 lack rootfs "preloaded:lucid64")`,
		},
		{
			name: "missing provider", cells: proposalCells, rootfs: "oci:///app",
			wantCode: codeMismatch,
			wantMsg:  `found no compatible cell: 0/9 cells eligible (9 lack rootfs provider "oci")`,
		},
		{
			name: "satisfiable constraint, cells full", cells: proposalCells, require: []string{"staging"}, memory: 2048,
			wantCode: codeInsufficient,
			wantMsg:  `insufficient resources: memory (4 compatible cells)`,
		},
		{
			name: "one compatible cell without memory or containers", require: []string{"staging", "skynet"}, disallow: []string{"production"},
			cells: func() []*Cell {
				cs := proposalCells()[:2]
				cs[0].Available = Capacity{MemoryMB: 10, DiskMB: 4096, Containers: 0}
				cs[1].Tags = TagSet("staging")
				return cs
			},
			wantCode: codeInsufficient,
			wantMsg:  `insufficient resources: memory, containers (1 compatible cell)`,
		},
		{
			name: "evacuating and unreachable cells", require: []string{"staging"},
			cells: func() []*Cell {
				cs := proposalCells()
				cs[0].Evacuating = true
				cs[1].Unreachable = true
				cs[2].Unreachable = true
				cs[3].Tags = TagSet("production")
				return cs
			},
			wantCode: codeCommunication,
			wantMsg:  `could not reach any compatible cell: 0/3 compatible cells available (2 did not answer, 1 is evacuating)`,
		},
		{
			name: "every compatible cell evacuating", require: []string{"staging"},
			cells: func() []*Cell {
				cs := proposalCells()
				for _, c := range cs[:4] {
					c.Evacuating = true
				}
				return cs
			},
			wantCode: codeInsufficient,
			wantMsg:  `insufficient resources: no compatible cell takes work (4 compatible cells: 4 are evacuating)`,
		},
		{
			name: "compatible cells full, evacuating or unreachable", require: []string{"staging"}, memory: 2048,
			cells: func() []*Cell {
				cs := proposalCells()
				cs[0].Evacuating = true
				cs[1].Unreachable = true
				return cs
			},
			wantCode: codeInsufficient,
			wantMsg:  `insufficient resources: memory (4 compatible cells: 2 without room, 1 is evacuating, 1 did not answer)`,
		},
		{
			name: "unreachable cells that could never run it", require: []string{"alfalfa"},
			cells: func() []*Cell {
				cs := proposalCells()
				cs[0].Unreachable = true
				cs[1].Evacuating = true
				return cs
			},
			wantCode: codeMismatch,
			wantMsg:  `found no compatible cell: 0/9 cells eligible (9 lack tag "alfalfa")`,
		},
		{
			name: "every cell unreachable",
			cells: func() []*Cell {
				cs := proposalCells()[:3]
				for _, c := range cs {
					c.Unreachable = true
				}
				return cs
			},
			wantCode: codeCommunication,
			wantMsg:  `could not reach any compatible cell: 0/3 compatible cells available (3 did not answer)`,
		},
		{
			name: "no cells", cells: func() []*Cell { return nil },
			wantCode: codeMismatch,
			wantMsg:  `found no compatible cell: no cells are registered`,
		},
		{
			name: "the only compatible cell refused", cells: proposalCells, require: []string{"staging", "skynet"}, refused: Refused{"cell-1": true, "cell-2": true},
			wantCode: codeCommunication,
			wantMsg:  `could not reach any compatible cell: 0/2 compatible cells available (2 already refused it)`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := lrpWork("web", 0, 64)
			if tc.memory > 0 {
				w.MemoryMB = tc.memory
			}
			if tc.rootfs != "" {
				w.Rootfs = tc.rootfs
			}
			w.Require, w.Disallow = tc.require, tc.disallow
			c, f := NewStack().Select(w, tc.cells(), tc.refused)
			if f == nil {
				t.Fatalf("placed on %s, want a failure", c.ID)
			}
			if f.Code != tc.wantCode || f.Message != tc.wantMsg {
				t.Fatalf("got %s %q\nwant %s %q", f.Code, f.Message, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

// TestStackFillsUp places until the staging cells are full: the next instance gets
// INSUFFICIENT_RESOURCES naming memory, though production cells still have room.
func TestStackFillsUp(t *testing.T) {
	cells := proposalCells()
	s := NewStack()
	for i := range 8 {
		w := lrpWork("web", int32(i), 512)
		w.Require = []string{"staging"}
		c, f := s.Select(w, cells, nil)
		if f != nil {
			t.Fatalf("instance %d: %v", i, f)
		}
		c.Reserve(w)
	}
	w := lrpWork("web", 8, 512)
	w.Require = []string{"staging"}
	_, f := s.Select(w, cells, nil)
	if f == nil || f.Code != codeInsufficient || f.Message != "insufficient resources: memory (4 compatible cells)" {
		t.Fatalf("got %v", f)
	}
	// Tasks see the same reservations; without the constraint they go to the free cells.
	task := taskWork("t", 1)
	task.Require = []string{"staging"}
	if _, f := s.Select(task, cells, nil); f == nil || f.Code != codeInsufficient {
		t.Fatalf("task on full staging cells: %v", f)
	}
	task.Require = nil
	if c, f := s.Select(task, cells, nil); f != nil || !slices.Contains([]int{5, 6, 7, 8, 9}, ids([]*Cell{c})[0]) {
		t.Fatalf("unconstrained task: %v %v", c, f)
	}
}

func TestStackPrefersLeastLoadedCell(t *testing.T) {
	cells := []*Cell{newCell("cell-1", "z"), newCell("cell-2", "z"), newCell("cell-3", "z")}
	cells[0].Available.MemoryMB = 100
	cells[1].Starting = 4
	c, f := NewStack().Select(taskWork("t", 64), cells, nil)
	if f != nil || c.ID != "cell-3" {
		t.Fatalf("chose %v (%v), want cell-3", c, f)
	}
}
