package bbs_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// keyDir writes a fresh key file per label into a temporary directory and returns the key
// files by label.
func keyDir(t testing.TB, labels ...string) map[string]sealing.KeyFile {
	t.Helper()
	dir := t.TempDir()
	out := map[string]sealing.KeyFile{}
	for _, l := range labels {
		path := filepath.Join(dir, l+".key")
		if err := sealing.WriteKeyFile(path); err != nil {
			t.Fatal(err)
		}
		out[l] = sealing.KeyFile{Label: l, File: path}
	}
	return out
}

// encryption configures a BBS to seal under active with the keys of labels (from keys).
func encryption(keys map[string]sealing.KeyFile, active string, labels ...string) func(*bbs.Config) {
	return func(c *bbs.Config) {
		c.Encryption = sealing.Config{ActiveKeyLabel: active}
		for _, l := range labels {
			c.Encryption.Keys = append(c.Encryption.Keys, keys[l])
		}
	}
}

// secretLRP is an LRP whose env, action and properties carry values that must never be
// stored clear.
func secretLRP(guid string) *modelsv1.DesiredLRP {
	d := lrp(guid, 1)
	d.Env = []*modelsv1.EnvironmentVariable{{Name: "DB_PASSWORD", Value: "s3cret-env-" + guid}}
	d.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/opt/s3cret-action-" + guid}}}
	d.Properties = map[string]string{"vault.token": "s3cret-prop-" + guid}
	return d
}

// etcdValues returns every key's value in etcd.
func etcdValues(t *testing.T, cli *clientv3.Client) map[string][]byte {
	t.Helper()
	resp, err := cli.Get(ctxT(t), "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.Value
	}
	return out
}

// TestEncryptionHidesUserDataAtRest is the acceptance test "strings over an etcd snapshot":
// with encryption on, neither the value of an env variable nor the plaintext of an action or a
// property of an LRP or a task appears in any etcd value, nor anywhere in a snapshot taken
// through the client API (which holds every revision, not only the latest); the API still
// answers them in plaintext. The scheduling info stays clear, which the scan sees (so it would
// see the secrets too).
func TestEncryptionHidesUserDataAtRest(t *testing.T) {
	keys := keyDir(t, "k1")
	env := bbstest.Start(t, encryption(keys, "k1", "k1"))
	ctx := ctxT(t)
	if _, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: secretLRP("web")}); err != nil {
		t.Fatal(err)
	}
	def := taskDefinition()
	def.Env = []*modelsv1.EnvironmentVariable{{Name: "API_KEY", Value: "s3cret-env-task"}}
	def.Action = &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/opt/s3cret-action-task"}}}
	def.Properties = map[string]string{"vault.token": "s3cret-prop-task"}
	taskDesire(t, env, "job", "tasks", def)
	// A change of the task rewrites its sealed record.
	if _, err := env.Client.CancelTask(ctx, &bbsv1.CancelTaskRequest{TaskGuid: "job"}); err != nil {
		t.Fatal(err)
	}

	secrets := []string{"s3cret-env-web", "s3cret-action-web", "s3cret-prop-web", "s3cret-env-task", "s3cret-action-task", "s3cret-prop-task", "s3cret"}
	values := etcdValues(t, env.Etcd)
	for key, v := range values {
		for _, s := range secrets {
			if bytes.Contains(v, []byte(s)) {
				t.Errorf("etcd value of %s contains %q", key, s)
			}
		}
	}
	for _, key := range []string{"/gavel/v1/desired/run/web", "/gavel/v1/task/job"} {
		if label, sealed, err := sealing.LabelOf(values[key]); !sealed || label != "k1" || err != nil {
			t.Errorf("%s: sealed %v under %q (%v), want sealed under k1", key, sealed, label, err)
		}
	}

	rc, err := env.Etcd.Snapshot(ctx)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	snap, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatalf("read snapshot: %v", err)
	}
	for _, s := range secrets {
		if bytes.Contains(snap, []byte(s)) {
			t.Errorf("the etcd snapshot contains %q", s)
		}
	}
	if !bytes.Contains(snap, []byte("web.example.com")) { // the clear scheduling info's route
		t.Fatal("the snapshot scan does not see clear records: it proves nothing")
	}

	got, err := env.Client.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: "web"})
	if err != nil {
		t.Fatal(err)
	}
	d := got.GetDesiredLrp()
	if d.GetEnv()[0].GetValue() != "s3cret-env-web" || d.GetAction().GetRun().GetPath() != "/opt/s3cret-action-web" || d.GetProperties()["vault.token"] != "s3cret-prop-web" {
		t.Fatalf("the API does not answer the plaintext: %v", d)
	}
	tk, err := env.Client.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: "job"})
	if err != nil || tk.GetTask().GetDefinition().GetEnv()[0].GetValue() != "s3cret-env-task" {
		t.Fatalf("TaskByGuid = %v, %v", tk, err)
	}
}

// TestEncryptionMissingKeyRefusesToStart: a BBS whose keyring lacks a key that a stored record
// is sealed under refuses to start at its first full listing, naming the label, and writes
// nothing; with encryption off altogether it refuses the same way.
func TestEncryptionMissingKeyRefusesToStart(t *testing.T) {
	keys := keyDir(t, "k1", "k2")
	_, cli := etcdtest.Start(t)
	first := bbstest.StartOn(t, cli, encryption(keys, "k1", "k1"))
	if _, err := first.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: secretLRP("web")}); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		configure func(*bbs.Config)
	}{
		{"old key removed", encryption(keys, "k2", "k2")},
		{"encryption off", func(*bbs.Config) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := revisionOf(t, cli)
			cfg := bbs.Default()
			cfg.ListenAddress = "127.0.0.1:0"
			cfg.TLS, cfg.EtcdTLS = tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}
			tc.configure(&cfg)
			svc, err := bbs.New(cfg, logtest.New(t), cli)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), testkit.ReadyTimeout)
			defer cancel()
			err = svc.Run(ctx, func() { t.Error("the BBS served with a record it cannot open") })
			if err == nil || !strings.Contains(err.Error(), `key label "k1"`) || !strings.Contains(err.Error(), "/gavel/v1/desired/run/web") {
				t.Fatalf("Run = %v, want a refusal naming key label k1 and the record", err)
			}
			if after := revisionOf(t, cli); after != before {
				t.Fatalf("etcd changed from revision %d to %d", before, after)
			}
		})
	}
}

// TestEncryptionBadConfigRefused: each bad encryption section stops the BBS in New, naming the
// file or label, before it touches etcd.
func TestEncryptionBadConfigRefused(t *testing.T) {
	keys := keyDir(t, "k1")
	missing := filepath.Join(t.TempDir(), "gone.key")
	_, cli := etcdtest.Start(t)
	for _, tc := range []struct {
		name string
		enc  sealing.Config
		want string
	}{
		{"missing file", sealing.Config{ActiveKeyLabel: "a", Keys: []sealing.KeyFile{{Label: "a", File: missing}}}, missing},
		{"duplicate label", sealing.Config{ActiveKeyLabel: "k1", Keys: []sealing.KeyFile{keys["k1"], keys["k1"]}}, `label "k1" is given twice`},
		{"active label without key", sealing.Config{ActiveKeyLabel: "k9", Keys: []sealing.KeyFile{keys["k1"]}}, `active_key_label "k9" has no key`},
		{"no active label", sealing.Config{Keys: []sealing.KeyFile{keys["k1"]}}, "active_key_label is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := revisionOf(t, cli)
			cfg := bbs.Default()
			cfg.TLS, cfg.EtcdTLS = tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}
			cfg.Encryption = tc.enc
			_, err := bbs.New(cfg, logtest.New(t), cli)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error naming %q", err, tc.want)
			}
			if after := revisionOf(t, cli); after != before {
				t.Fatalf("etcd changed from revision %d to %d", before, after)
			}
		})
	}
}

// revisionOf is etcd's current revision.
func revisionOf(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(ctxT(t), "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// rotationLRPs is how many LRPs the rotation test stores before switching keys (the issue's
// 1,000), half written clear and half under the first key.
const rotationLRPs = 1000

// TestEncryptionRotationUnderLoad is the acceptance test of key rotation. 500 LRPs are written
// clear (a store from before encryption), 500 more and 50 tasks under key k1; then the BBS
// restarts with k2 active (k1 kept to decrypt) as the leader, and while it re-encrypts, clients
// keep desiring new LRPs, updating existing ones and reading. Every read succeeds; the metric
// gavel_bbs_records_to_reencrypt reaches zero; every run info and task in etcd is then sealed
// under k2 and every LRP reads back whole with its last update. Finally k1 is removed and a
// BBS still starts and serves every record.
func TestEncryptionRotationUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a thousand LRPs")
	}
	keys := keyDir(t, "k1", "k2")
	_, cli := etcdtest.Start(t)
	ctx := ctxT(t)
	desire := func(env *bbstest.Env, guids []string) {
		t.Helper()
		err := parallel(len(guids), 16, func(_, i int) error {
			_, err := env.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: secretLRP(guids[i])})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	guids := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s-%04d", prefix, i)
		}
		return out
	}

	clear := bbstest.StartOn(t, cli)
	desire(clear, guids("clear", rotationLRPs/2))
	if err := clear.Stop(); err != nil {
		t.Fatal(err)
	}
	old := bbstest.StartOn(t, cli, encryption(keys, "k1", "k1"))
	desire(old, guids("old", rotationLRPs/2))
	for _, g := range guids("task", 50) {
		taskDesire(t, old, g, "tasks", taskDefinition())
	}
	if err := old.Stop(); err != nil {
		t.Fatal(err)
	}

	// The new active key, k1 kept to open what it sealed; the leader loop re-encrypts.
	rotating := bbstest.StartOnWith(t, cli, nil, encryption(keys, "k2", "k1", "k2"), func(c *bbs.Config) {
		c.MetricsAddress = "127.0.0.1:0"
		c.ReencryptBatch = 8 // more, smaller transactions: a longer rotation for the load to meet
	})
	testkit.Eventually(t, 30*time.Second, rotating.Service.IsLeader, "the restarted BBS leads")
	var (
		stop      = make(chan struct{})
		wg        sync.WaitGroup
		annotated sync.Map // guid → last annotation written
		newGuids  atomic.Int64
		failures  = make(chan error, 100)
	)
	fail := func(err error) {
		select {
		case failures <- err:
		default:
		}
	}
	// Re-encryption rewrites records unchanged: subscribers see no event of it.
	sctx, stopEvents := context.WithCancel(ctx)
	stream, err := rotating.Client.SubscribeToEvents(sctx, &bbsv1.SubscribeToEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	eventsDone := make(chan struct{})
	go func() {
		defer close(eventsDone)
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			for _, e := range r.GetEvents() {
				if c := e.GetDesiredLrpChanged(); c != nil && proto.Equal(c.GetBefore(), c.GetAfter()) {
					fail(fmt.Errorf("re-encryption published a change of %s that changes nothing", c.GetAfter().GetProcessGuid()))
				}
				if c := e.GetTaskChanged(); c != nil && proto.Equal(c.GetBefore(), c.GetAfter()) {
					fail(fmt.Errorf("re-encryption published a change of task %s that changes nothing", c.GetAfter().GetTaskGuid()))
				}
			}
		}
	}()
	existing := append(guids("clear", rotationLRPs/2), guids("old", rotationLRPs/2)...)
	for w := range 4 {
		wg.Add(1)
		go func() { // desires new LRPs and updates existing ones
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				g := fmt.Sprintf("new-%d-%04d", w, i)
				if _, err := rotating.Client.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: secretLRP(g)}); err != nil {
					fail(fmt.Errorf("desire %s: %w", g, err))
					return
				}
				newGuids.Add(1)
				target := existing[w+4*(i%(len(existing)/4))] // each worker updates its own quarter
				note := "update-" + strconv.Itoa(i)
				if _, err := rotating.Client.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: target,
					Update: &modelsv1.DesiredLRPUpdate{Annotation: &note}}); err != nil {
					fail(fmt.Errorf("update %s: %w", target, err))
					return
				}
				annotated.Store(target, note)
			}
		}()
	}
	wg.Add(1)
	go func() { // reads never fail
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			g := existing[(i*13)%len(existing)]
			resp, err := rotating.Client.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: g})
			if err != nil || resp.GetDesiredLrp().GetEnv()[0].GetValue() != "s3cret-env-"+g {
				fail(fmt.Errorf("read %s during rotation: %v, %v", g, resp, err))
				return
			}
		}
	}()
	leftWhileWriting := 0 // the largest count left seen once writes had begun, for the log
	toReencrypt := func() (bool, string) {
		body := testkit.Scrape(t, rotating.Service.MetricsAddr())
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, "gavel_bbs_records_to_reencrypt "); ok {
				if n, _ := strconv.Atoi(v); newGuids.Load() > 0 {
					leftWhileWriting = max(leftWhileWriting, n)
				}
				return v == "0" && newGuids.Load() > 0, line
			}
		}
		return false, "gavel_bbs_records_to_reencrypt missing"
	}
	testkit.EventuallyState(t, 60*time.Second, toReencrypt, "every record re-encrypted under k2")
	close(stop)
	wg.Wait()
	stopEvents()
	<-eventsDone
	t.Logf("re-encrypted %d LRPs and 50 tasks while %d LRPs were desired and as many updated (up to %d records left seen under that load)",
		rotationLRPs, newGuids.Load(), leftWhileWriting)
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every run info and task in etcd is sealed under k2, and none is missing.
	runs, tasks := 0, 0
	for key, v := range etcdValues(t, cli) {
		isRun, isTask := strings.HasPrefix(key, "/gavel/v1/desired/run/"), strings.HasPrefix(key, "/gavel/v1/task/")
		if !isRun && !isTask {
			continue
		}
		if isRun {
			runs++
		} else {
			tasks++
		}
		if label, sealed, err := sealing.LabelOf(v); !sealed || label != "k2" || err != nil {
			t.Errorf("%s: sealed %v under %q (%v) after rotation, want k2", key, sealed, label, err)
		}
	}
	if want := rotationLRPs + int(newGuids.Load()); runs != want || tasks != 50 {
		t.Fatalf("%d run infos and %d tasks in etcd, want %d and 50", runs, tasks, want)
	}
	if err := rotating.Stop(); err != nil {
		t.Fatal(err)
	}

	// k1 is no longer used: a BBS without it starts, and every record reads back whole.
	final := bbstest.StartOn(t, cli, encryption(keys, "k2", "k2"))
	list, err := final.Client.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(list.GetDesiredLrps()), runs; got != want {
		t.Fatalf("%d desired LRPs after removing k1, want %d", got, want)
	}
	for _, d := range list.GetDesiredLrps() {
		g := d.GetProcessGuid()
		if d.GetEnv()[0].GetValue() != "s3cret-env-"+g || d.GetAction().GetRun().GetPath() != "/opt/s3cret-action-"+g ||
			d.GetProperties()["vault.token"] != "s3cret-prop-"+g {
			t.Fatalf("%s corrupted: %v", g, d)
		}
		if note, ok := annotated.Load(g); ok && d.GetAnnotation() != note {
			t.Fatalf("%s: annotation %q, want the last update %q", g, d.GetAnnotation(), note)
		}
	}
	tl, err := final.Client.Tasks(ctx, &bbsv1.TasksRequest{})
	if err != nil || len(tl.GetTasks()) != 50 {
		t.Fatalf("Tasks = %d, %v; want 50", len(tl.GetTasks()), err)
	}
}
