package testkit

import (
	"testing"

	"github.com/gavel-sched/gavel/pkg/porttest"
)

// PortBlock reserves n consecutive host ports for the test (see porttest.PortBlock).
func PortBlock(t testing.TB, n int) (first, last int) {
	t.Helper()
	return porttest.PortBlock(t, n)
}

// ReservedPort is a port no other test and no listener on port 0 gets while the test runs (see
// porttest.ReservedPort).
func ReservedPort(t testing.TB) int {
	t.Helper()
	return porttest.ReservedPort(t)
}

// ReservedAddr is 127.0.0.1 with a ReservedPort (see porttest.ReservedAddr).
func ReservedAddr(t testing.TB) string {
	t.Helper()
	return porttest.ReservedAddr(t)
}
