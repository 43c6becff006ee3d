package placement

import (
	"slices"
	"testing"
)

func TestRootfsFilter(t *testing.T) {
	cell := &Cell{ID: "c", PreloadedRootfses: NameSet("cflinuxfs4", "lucid64"), RootfsProviders: TagSet("docker")}
	bare := &Cell{ID: "bare"}
	tests := []struct {
		rootfs     string
		cell       *Cell
		wantReason string // empty: passes
	}{
		{"preloaded:cflinuxfs4", cell, ""},
		{"preloaded://cflinuxfs4", cell, ""},
		{"preloaded://lucid64", cell, ""},
		{"PRELOADED:lucid64", cell, ""},
		{"preloaded:///lucid64/", cell, ""},
		{"preloaded:cflinuxfs2", cell, `lack rootfs "preloaded:cflinuxfs2"`},
		{"preloaded:CFLINUXFS4", cell, `lack rootfs "preloaded:CFLINUXFS4"`},    // names are exact
		{"Preloaded://cflinuxfs2/", cell, `lack rootfs "preloaded:cflinuxfs2"`}, // named canonically
		{"docker:///library/redis#7", cell, ""},
		{"DOCKER:///library/redis#7", cell, ""}, // schemes are case-insensitive
		{"oci:///library/redis", cell, `lack rootfs provider "oci"`},
		{"docker:///library/redis#7", bare, `lack rootfs provider "docker"`},
		{"preloaded:cflinuxfs4", bare, `lack rootfs "preloaded:cflinuxfs4"`},
		{"noscheme", cell, `lack rootfs "noscheme"`},
	}
	for _, tc := range tests {
		w := &Work{Kind: KindTask, TaskGuid: "t", Rootfs: tc.rootfs}
		rs := Rootfs{}.Check(w, tc.cell)
		var got string
		if len(rs) > 0 {
			got = rs[0].Many
		}
		if got != tc.wantReason || len(rs) > 1 {
			t.Errorf("rootfs %q on %s: reasons %v, want %q", tc.rootfs, tc.cell.ID, rs, tc.wantReason)
		}
	}
}

func TestRootfsFilterOnProposalCells(t *testing.T) {
	cells := proposalCells()
	for _, c := range cells[:4] {
		c.PreloadedRootfses = NameSet("cflinuxfs2")
	}
	w := lrpWork("web", 0, 64)
	if got := ids(passing(Rootfs{}, w, cells)); !slices.Equal(got, []int{5, 6, 7, 8, 9}) {
		t.Fatalf("cflinuxfs4 on cells %v, want 5-9", got)
	}
}
