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

// TestRedactImagePassword: a desired LRP's, its run info's and a task's image_password (a
// debug_redact field) is a secret like a secret env value: redacted in a copy, the user name
// kept; an event carrying the LRP is covered by the same walk.
func TestRedactImagePassword(t *testing.T) {
	d := &modelsv1.DesiredLRP{ProcessGuid: "p", Rootfs: "docker:///app#1", ImageUsername: "u", ImagePassword: "hunter2"}
	task := &modelsv1.Task{Definition: &modelsv1.TaskDefinition{ImageUsername: "u", ImagePassword: "hunter2"}}
	for _, m := range []proto.Message{d, RunInfo(d), task} {
		if !HasSecret(m) {
			t.Errorf("%T: HasSecret = false", m)
		}
		got := RedactSecrets(m)
		if proto.Equal(got, m) {
			t.Errorf("%T: not redacted", m)
		}
		if HasSecret(got) {
			t.Errorf("%T: still has a secret", m)
		}
	}
	if got := RedactSecrets(d); got.GetImagePassword() != Redacted || got.GetImageUsername() != "u" || d.GetImagePassword() != "hunter2" {
		t.Errorf("redacted %v, original %v", got, d)
	}
	if HasSecret(&modelsv1.DesiredLRP{ImageUsername: "u"}) {
		t.Error("a user name alone is a secret")
	}
}

// TestMayHoldSecret: only message types from which a secret is reachable are walked; a
// recursive type (actions nest actions) ends.
func TestMayHoldSecret(t *testing.T) {
	for _, tt := range []struct {
		m    proto.Message
		want bool
	}{
		{&modelsv1.DesiredLRP{}, true},
		{&modelsv1.Task{}, true},
		{&modelsv1.Action{}, true}, // run actions carry env
		{&modelsv1.EnvironmentVariable{}, true},
		{&modelsv1.ActualLRP{}, false},
		{&modelsv1.CellPresence{}, false},
	} {
		md := tt.m.ProtoReflect().Descriptor()
		if got := mayHoldSecret(md); got != tt.want {
			t.Errorf("mayHoldSecret(%s) = %v, want %v", md.FullName(), got, tt.want)
		}
	}
}

// BenchmarkHasSecretActualLRP is the check the BBS makes on every actual LRP it sends to a
// caller that may not read secrets (events, lists).
func BenchmarkHasSecretActualLRP(b *testing.B) {
	a := &modelsv1.ActualLRP{
		Key:         &modelsv1.ActualLRPKey{ProcessGuid: "web", Index: 3, Domain: "apps"},
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "i-1", CellId: "cell-1"},
		NetInfo:     &modelsv1.ActualLRPNetInfo{Address: "10.0.0.1", Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 61000}}},
		State:       modelsv1.ActualLRP_STATE_RUNNING,
	}
	for b.Loop() {
		if HasSecret(a) {
			b.Fatal("an actual LRP holds no secret")
		}
	}
}
