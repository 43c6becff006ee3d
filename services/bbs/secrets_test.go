package bbs_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

const (
	lrpSecret  = "lrp-s3cr3t-value"
	taskSecret = "task-s3cr3t-value"
)

// secretEnvLRP is lrp(guid) with a plain and a secret env var, and a secret in its run action.
func secretEnvLRP(guid string) *modelsv1.DesiredLRP {
	d := lrp(guid, 1)
	d.Env = []*modelsv1.EnvironmentVariable{{Name: "GREETING", Value: "hello"}, {Name: "DB_PASSWORD", Value: lrpSecret, Secret: true}}
	d.GetAction().GetRun().Env = []*modelsv1.EnvironmentVariable{{Name: "API_KEY", Value: lrpSecret, Secret: true}}
	return d
}

// wantEnv checks the plain var intact and the secret one as want (the value or the marker).
func wantEnv(t *testing.T, who, what string, env []*modelsv1.EnvironmentVariable, secretName, want string) {
	t.Helper()
	got := map[string]*modelsv1.EnvironmentVariable{}
	for _, e := range env {
		got[e.GetName()] = e
	}
	if g := got["GREETING"]; g != nil && g.GetValue() != "hello" {
		t.Errorf("%s: %s: plain GREETING = %q", who, what, g.GetValue())
	}
	if s := got[secretName]; s.GetValue() != want || !s.GetSecret() {
		t.Errorf("%s: %s: %s = %q (secret %v), want %q", who, what, secretName, s.GetValue(), s.GetSecret(), want)
	}
}

// TestSecretEnvRedactedByRole desires an LRP and a task with a secret and a plain env var as
// admin, over mutual TLS, and reads them back as every kind of caller: read-only, nsync and
// the route-emitter see the secret values replaced by "<redacted>" (the plain ones and the
// names intact) in DesiredLRPs, DesiredLRPByProcessGuid, Tasks, TaskByGuid, UpdateDesiredLRP's
// answer and every event (desired LRP created/changed/removed, task created/changed/removed);
// admin sees the values everywhere; a rep sees them for its own cell's work only (claim,
// DesiredLRPByProcessGuid of an LRP it runs, its task) and redacted for another cell's and on
// the event stream. The cached records are never changed by a redacted read.
func TestSecretEnvRedactedByRole(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "bbs", "admin", "read-only", "nsync", "route-emitter", "rep/cell-1", "rep/cell-2")
	if err != nil {
		t.Fatal(err)
	}
	env := bbstest.Start(t, func(c *bbs.Config) {
		c.TLS = pki["bbs"]
		c.Authz.NsyncDomains = []string{"apps"}
	})
	client := func(name string) bbsv1.BBSServiceClient { return tlsClient(t, env.Addr, pki[name]) }
	admin, readOnly, nsync, emitter := client("admin"), client("read-only"), client("nsync"), client("route-emitter")
	rep1, rep2 := client("rep/cell-1"), client("rep/cell-2")
	ctx := ctxT(t)

	subscribe := func(c bbsv1.BBSServiceClient) *evEventStream {
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		stream, err := c.SubscribeToEvents(sctx, &bbsv1.SubscribeToEventsRequest{SinceRevision: storeRevision(t, env)})
		if err != nil {
			t.Fatal(err)
		}
		s := &evEventStream{t: t, stream: stream, cancel: cancel}
		s.waitBookmark()
		return s
	}
	streams := map[string]*evEventStream{"admin": subscribe(admin), "read-only": subscribe(readOnly), "rep/cell-1": subscribe(rep1)}

	if _, err := admin.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: secretEnvLRP("web")}); err != nil {
		t.Fatalf("desire: %v", err)
	}
	def := taskDefinition()
	def.Env = []*modelsv1.EnvironmentVariable{{Name: "GREETING", Value: "hello"}, {Name: "TOKEN", Value: taskSecret, Secret: true}}
	if _, err := admin.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: "job", Domain: "apps", Definition: def}); err != nil {
		t.Fatalf("desire task: %v", err)
	}
	// The rep of cell-1 claims the instance and starts the task: both are its work.
	claim, err := rep1.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "web", Index: 0,
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-0", CellId: "cell-1"}, IncludeDesiredLrp: true})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	wantEnv(t, "rep/cell-1", "ClaimActualLRP", claim.GetDesiredLrp().GetEnv(), "DB_PASSWORD", lrpSecret)
	if _, err := rep1.StartTask(ctx, &bbsv1.StartTaskRequest{TaskGuid: "job", CellId: "cell-1"}); err != nil {
		t.Fatalf("start task: %v", err)
	}
	// nsync's update (an instance count) answers the LRP, redacted for nsync.
	up, err := nsync.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: "web", Update: &modelsv1.DesiredLRPUpdate{Instances: proto.Int32(2)}})
	if err != nil {
		t.Fatalf("nsync update: %v", err)
	}
	wantEnv(t, "nsync", "UpdateDesiredLRP", up.GetDesiredLrp().GetEnv(), "DB_PASSWORD", models.Redacted)

	type view struct {
		name   string
		c      bbsv1.BBSServiceClient
		lrp    string // what the caller sees of the LRP's secret
		task   string // and of the task's
		stream bool   // whether it sees secrets on the event stream
	}
	views := []view{
		{"admin", admin, lrpSecret, taskSecret, true},
		{"read-only", readOnly, models.Redacted, models.Redacted, false},
		{"nsync", nsync, models.Redacted, models.Redacted, false},
		{"route-emitter", emitter, models.Redacted, models.Redacted, false},
		{"rep/cell-1", rep1, lrpSecret, taskSecret, false},
		{"rep/cell-2", rep2, models.Redacted, models.Redacted, false},
	}
	for _, v := range views {
		list, err := v.c.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
		if err != nil || len(list.GetDesiredLrps()) != 1 {
			t.Fatalf("%s: DesiredLRPs: %v %v", v.name, list, err)
		}
		d := list.GetDesiredLrps()[0]
		wantEnv(t, v.name, "DesiredLRPs", d.GetEnv(), "DB_PASSWORD", v.lrp)
		wantEnv(t, v.name, "DesiredLRPs action", d.GetAction().GetRun().GetEnv(), "API_KEY", v.lrp)
		one, err := v.c.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
		if err != nil {
			t.Fatalf("%s: DesiredLRPByProcessGuid: %v", v.name, err)
		}
		wantEnv(t, v.name, "DesiredLRPByProcessGuid", one.GetDesiredLrp().GetEnv(), "DB_PASSWORD", v.lrp)
		wantEnv(t, v.name, "DesiredLRPByProcessGuid action", one.GetDesiredLrp().GetAction().GetRun().GetEnv(), "API_KEY", v.lrp)
		tasks, err := v.c.Tasks(ctx, &bbsv1.TasksRequest{})
		if err != nil || len(tasks.GetTasks()) != 1 {
			t.Fatalf("%s: Tasks: %v %v", v.name, tasks, err)
		}
		wantEnv(t, v.name, "Tasks", tasks.GetTasks()[0].GetDefinition().GetEnv(), "TOKEN", v.task)
		tk, err := v.c.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: "job"})
		if err != nil {
			t.Fatalf("%s: TaskByGuid: %v", v.name, err)
		}
		wantEnv(t, v.name, "TaskByGuid", tk.GetTask().GetDefinition().GetEnv(), "TOKEN", v.task)
	}

	// Redacted reads left the cache alone: admin still reads the values.
	one, err := admin.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	wantEnv(t, "admin", "after redacted reads", one.GetDesiredLrp().GetEnv(), "DB_PASSWORD", lrpSecret)

	// Removal events: the LRP is removed, the task cancelled and deleted.
	if _, err := admin.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: "web"}); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := admin.CancelTask(ctx, &bbsv1.CancelTaskRequest{TaskGuid: "job"}); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if _, err := admin.ResolvingTask(ctx, &bbsv1.ResolvingTaskRequest{TaskGuid: "job"}); err != nil {
		t.Fatalf("resolving: %v", err)
	}
	if _, err := admin.DeleteTask(ctx, &bbsv1.DeleteTaskRequest{TaskGuid: "job"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	last := storeRevision(t, env)
	carrying := []string{"DesiredLrpCreated", "DesiredLrpChanged", "DesiredLrpRemoved", "TaskCreated", "TaskChanged", "TaskRemoved"}
	for name, s := range streams {
		withSecret, redacted := map[string]bool{}, map[string]bool{}
		for _, r := range s.until(last) {
			for _, e := range r.GetEvents() {
				b, err := protojson.Marshal(e)
				if err != nil {
					t.Fatal(err)
				}
				text := string(b)
				if strings.Contains(text, lrpSecret) || strings.Contains(text, taskSecret) {
					withSecret[evKindName(e)] = true
				}
				if strings.Contains(text, models.Redacted) {
					redacted[evKindName(e)] = true
				}
			}
		}
		for _, kind := range carrying {
			if name == "admin" {
				if !withSecret[kind] || redacted[kind] {
					t.Errorf("admin's %s events: secret %v, redacted %v; want the values", kind, withSecret[kind], redacted[kind])
				}
			} else if withSecret[kind] || !redacted[kind] {
				t.Errorf("%s's %s events: secret %v, redacted %v; want them redacted", name, kind, withSecret[kind], redacted[kind])
			}
		}
	}
}

// TestImagePasswordRedacted: a desired LRP's and a task's image_password is a secret as a
// secret env value is: read-only sees "<redacted>" (the user name intact), admin and the rep
// that claims the instance see the value. Credentials without a docker:// rootfs, or a user
// name without a password, are InvalidArgument naming the field, and nothing is stored.
func TestImagePasswordRedacted(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "bbs", "admin", "read-only", "rep/cell-1")
	if err != nil {
		t.Fatal(err)
	}
	env := bbstest.Start(t, func(c *bbs.Config) { c.TLS = pki["bbs"] })
	admin, readOnly, rep1 := tlsClient(t, env.Addr, pki["admin"]), tlsClient(t, env.Addr, pki["read-only"]), tlsClient(t, env.Addr, pki["rep/cell-1"])
	ctx := ctxT(t)
	const password = "registry-s3cr3t"

	d := lrp("private", 1)
	d.Rootfs, d.ImageUsername, d.ImagePassword = "docker://registry.example.com/app#1", "deploy", password
	bad := proto.Clone(d).(*modelsv1.DesiredLRP)
	bad.ProcessGuid, bad.ImagePassword = "bad", ""
	if _, err := admin.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: bad}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "desired_lrp.image_password") {
		t.Errorf("desire without a password: %v, want InvalidArgument naming desired_lrp.image_password", err)
	}
	bad = proto.Clone(d).(*modelsv1.DesiredLRP)
	bad.ProcessGuid, bad.Rootfs = "bad", "preloaded:cflinuxfs4"
	if _, err := admin.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: bad}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "desired_lrp.image_username") {
		t.Errorf("desire with credentials for a preloaded rootfs: %v, want InvalidArgument naming desired_lrp.image_username", err)
	}
	if _, err := admin.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "bad"}); status.Code(err) != codes.NotFound {
		t.Errorf("a refused LRP was stored: %v", err)
	}

	if _, err := admin.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d}); err != nil {
		t.Fatalf("desire: %v", err)
	}
	def := taskDefinition()
	def.Rootfs, def.ImageUsername, def.ImagePassword = "docker://registry.example.com/job#1", "deploy", password
	if _, err := admin.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: "job", Domain: "apps", Definition: def}); err != nil {
		t.Fatalf("desire task: %v", err)
	}
	claim, err := rep1.ClaimActualLRP(ctx, &bbsv1.ClaimActualLRPRequest{ProcessGuid: "private", Index: 0,
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-0", CellId: "cell-1"}, IncludeDesiredLrp: true})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if got := claim.GetDesiredLrp().GetImagePassword(); got != password {
		t.Errorf("the claiming rep reads image_password %q, want the value", got)
	}
	for _, v := range []struct {
		name string
		c    bbsv1.BBSServiceClient
		want string
	}{{"admin", admin, password}, {"read-only", readOnly, models.Redacted}} {
		one, err := v.c.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "private"})
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		if got := one.GetDesiredLrp(); got.GetImagePassword() != v.want || got.GetImageUsername() != "deploy" {
			t.Errorf("%s: image credentials %q/%q, want deploy/%q", v.name, got.GetImageUsername(), got.GetImagePassword(), v.want)
		}
		tk, err := v.c.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: "job"})
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		if got := tk.GetTask().GetDefinition().GetImagePassword(); got != v.want {
			t.Errorf("%s: task image_password %q, want %q", v.name, got, v.want)
		}
	}
}
