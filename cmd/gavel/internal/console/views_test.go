package console

import (
	"slices"
	"testing"
)

// TestReasons splits the auctioneer's placement messages (services/auctioneer/internal/placement
// explain.go) into their per-reason cell counts.
func TestReasons(t *testing.T) {
	for _, tt := range []struct {
		msg  string
		want []string
	}{
		{`found no compatible cell: 0/9 cells eligible (5 lack tag "staging", 4 lack rootfs "preloaded:lucid64")`,
			[]string{`5 lack tag "staging"`, `4 lack rootfs "preloaded:lucid64"`}},
		{`found no compatible cell: 0/2 cells eligible (2 lack tags "a, b")`, []string{`2 lack tags "a, b"`}},
		{`insufficient resources: memory, disk (4 compatible cells)`, []string{"4 compatible cells"}},
		{`insufficient resources: memory (4 compatible cells: 2 without room, 1 is evacuating, 1 did not answer)`,
			[]string{"2 without room", "1 is evacuating", "1 did not answer"}},
		{`could not reach any compatible cell: 0/3 compatible cells available (2 did not answer, 1 is evacuating)`,
			[]string{"2 did not answer", "1 is evacuating"}},
		{`found no compatible cell: no cells are registered`, nil},
	} {
		if got := reasons(tt.msg); !slices.Equal(got, tt.want) {
			t.Errorf("reasons(%q) = %q, want %q", tt.msg, got, tt.want)
		}
	}
}
