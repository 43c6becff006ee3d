package main

import (
	"slices"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

func TestKeep(t *testing.T) {
	var env []*modelsv1.EnvironmentVariable
	for _, n := range []string{"FOO_A", "BAR", "FOO_B", "foo_c", "FOO"} {
		env = append(env, &modelsv1.EnvironmentVariable{Name: n, Value: "v"})
	}
	var got []string
	for _, e := range keep(env, "FOO_") {
		got = append(got, e.GetName())
	}
	if want := []string{"FOO_A", "FOO_B"}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
	if kept := keep(nil, "FOO_"); kept != nil {
		t.Errorf("kept %v of nothing", kept)
	}
}
