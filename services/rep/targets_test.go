package rep_test

import (
	"slices"
	"testing"

	"github.com/gavel-sched/gavel/services/rep"
)

// TestBBSTargets checks that bbs_address may list several BBS instances and that bbs_addresses
// replaces it.
func TestBBSTargets(t *testing.T) {
	for _, tc := range []struct {
		address string
		list    []string
		want    []string
	}{
		{"bbs:8889", nil, []string{"bbs:8889"}},
		{"bbs-0:8889, bbs-1:8889", nil, []string{"bbs-0:8889", "bbs-1:8889"}},
		{"127.0.0.1:8889", []string{"a:1", "b:2"}, []string{"a:1", "b:2"}},
		{"", nil, nil},
	} {
		c := rep.Default()
		c.BBSAddress, c.BBSAddresses = tc.address, tc.list
		if got := c.BBSTargets(); !slices.Equal(got, tc.want) {
			t.Errorf("BBSTargets(%q, %q) = %q, want %q", tc.address, tc.list, got, tc.want)
		}
	}
}
