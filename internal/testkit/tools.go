package testkit

import (
	"os"
	"testing"
)

// SkipWithoutTool skips t, saying why (a binary is missing and how to install it), on a
// developer's machine; under CI (CI=true, as .ci/run runs, having installed every tool the
// tests need) it fails t instead, so that a missing install step can never hide a test as a
// silent skip.
func SkipWithoutTool(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI: %s (.ci/run must install it)", why)
	}
	t.Skip("SKIP: " + why)
}
