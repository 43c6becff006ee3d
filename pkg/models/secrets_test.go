package models

import (
	"testing"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// TestRedactSecrets: secret values anywhere in a task's tree (its env, a run action nested in a
// serial one) are redacted in a copy, plain values and names stay, the original is untouched,
// and a message without a secret comes back as itself.
func TestRedactSecrets(t *testing.T) {
	run := runAction("/bin/app")
	run.GetRun().Env = []*modelsv1.EnvironmentVariable{{Name: "NESTED", Value: "s2", Secret: true}}
	task := &modelsv1.Task{TaskGuid: "t", Definition: &modelsv1.TaskDefinition{
		Env:    []*modelsv1.EnvironmentVariable{{Name: "PLAIN", Value: "p"}, {Name: "PASSWORD", Value: "s1", Secret: true}},
		Action: serial(runAction("/bin/true"), run),
	}}
	orig := proto.Clone(task)
	if !HasSecret(task) {
		t.Fatal("HasSecret = false")
	}
	got := RedactSecrets(task)
	if !proto.Equal(task, orig) {
		t.Fatal("RedactSecrets changed its argument")
	}
	env := got.GetDefinition().GetEnv()
	if env[0].GetValue() != "p" || env[1].GetValue() != Redacted || env[1].GetName() != "PASSWORD" || !env[1].GetSecret() {
		t.Errorf("env = %v", env)
	}
	if v := got.GetDefinition().GetAction().GetSerial().GetActions()[1].GetRun().GetEnv()[0].GetValue(); v != Redacted {
		t.Errorf("nested run action's secret = %q", v)
	}
	if HasSecret(got) {
		t.Error("a redacted message still has a secret")
	}
	plain := &modelsv1.Task{Definition: &modelsv1.TaskDefinition{Env: []*modelsv1.EnvironmentVariable{{Name: "A", Value: "b"}}}}
	if RedactSecrets(plain) != plain {
		t.Error("a message without secrets was copied")
	}
	var none *modelsv1.Task
	if RedactSecrets(none) != nil || HasSecret(none) {
		t.Error("nil")
	}
}
