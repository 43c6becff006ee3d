package callback_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/bbs/internal/callback"
)

// fakeResolver records the calls the worker makes once a callback is delivered.
type fakeResolver struct {
	mu         sync.Mutex
	calls      []string
	resolveErr error
	called     chan struct{}
}

func newFakeResolver() *fakeResolver { return &fakeResolver{called: make(chan struct{}, 100)} }

func (r *fakeResolver) record(call string) {
	r.mu.Lock()
	r.calls = append(r.calls, call)
	r.mu.Unlock()
	r.called <- struct{}{}
}

func (r *fakeResolver) ResolvingTask(_ context.Context, guid string) error {
	r.record("resolving " + guid)
	return r.resolveErr
}

func (r *fakeResolver) DeleteTask(_ context.Context, guid string) error {
	r.record("delete " + guid)
	return nil
}

func (r *fakeResolver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// waitCalls waits until the resolver has seen n calls.
func (r *fakeResolver) waitCalls(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for len(r.got()) < n {
		select {
		case <-r.called:
		case <-deadline:
			t.Fatalf("resolver calls %v, want %d", r.got(), n)
		}
	}
	return r.got()
}

type request struct {
	method, contentType, path string
	body                      []byte
	at                        time.Time
}

// server is a callback receiver answering with the given statuses in turn (the last repeats).
// Requests block while hold is non-nil and open.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	answers  []int
	requests []request
	received chan struct{}
	hold     chan struct{}
}

func newServer(t *testing.T, answers ...int) *server {
	s := &server{answers: answers, received: make(chan struct{}, 100)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.requests = append(s.requests, request{r.Method, r.Header.Get("Content-Type"), r.URL.RequestURI(), body, time.Now()})
		code := s.answers[min(len(s.requests), len(s.answers))-1]
		hold := s.hold
		s.mu.Unlock()
		s.received <- struct{}{}
		if hold != nil {
			<-hold
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) got() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.requests...)
}

func (s *server) waitRequests(t *testing.T, n int) []request {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for len(s.got()) < n {
		select {
		case <-s.received:
		case <-deadline:
			t.Fatalf("server got %d requests, want %d", len(s.got()), n)
		}
	}
	return s.got()
}

// run starts w until the test ends and waits for it to be ready.
func run(t *testing.T, w *callback.Worker) {
	t.Helper()
	testkit.Start(t, "callback worker", w)
}

// newWorker returns a worker over a queue of the default size; tests enqueue on the queue.
func newWorker(t *testing.T, r callback.Resolver, cfg callback.Config) (*callback.Worker, *callback.Queue) {
	return newWorkerQueue(t, r, cfg, 0)
}

func newWorkerQueue(t *testing.T, r callback.Resolver, cfg callback.Config, queueSize int) (*callback.Worker, *callback.Queue) {
	if cfg.Backoff == 0 {
		cfg.Backoff = 20 * time.Millisecond
	}
	cfg.Logger = logtest.New(t)
	q := callback.NewQueue(queueSize, cfg.Logger)
	return callback.New(cfg, q, r), q
}

func completed(guid, url string) *modelsv1.Task {
	return &modelsv1.Task{
		TaskGuid: guid,
		Domain:   "tasks",
		Definition: &modelsv1.TaskDefinition{
			Rootfs:                "preloaded:cflinuxfs4",
			CompletionCallbackUrl: url,
			Annotation:            "job 7",
		},
		State:  modelsv1.Task_STATE_COMPLETED,
		CellId: "cell-1",
		Result: "42",
	}
}

func TestDeliverResolvesAndDeletes(t *testing.T) {
	srv := newServer(t, http.StatusOK)
	res := newFakeResolver()
	w, q := newWorker(t, res, callback.Config{})
	run(t, w)
	task := completed("t1", srv.URL+"/tasks/t1/done?sig=abc")
	q.Enqueue(task)

	calls := res.waitCalls(t, 2)
	if want := []string{"resolving t1", "delete t1"}; !equal(calls, want) {
		t.Fatalf("resolver calls %v, want %v", calls, want)
	}
	reqs := srv.got()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.method != http.MethodPost || r.contentType != "application/json" || r.path != "/tasks/t1/done?sig=abc" {
		t.Fatalf("request %s %s Content-Type %q", r.method, r.path, r.contentType)
	}
	var raw map[string]any
	if err := json.Unmarshal(r.body, &raw); err != nil {
		t.Fatalf("body is not JSON: %v: %s", err, r.body)
	}
	if raw["taskGuid"] != "t1" || raw["state"] != "STATE_COMPLETED" || raw["result"] != "42" {
		t.Fatalf("body %s", r.body)
	}
	var got modelsv1.Task
	if err := protojson.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, task) {
		t.Fatalf("delivered %v\nwant %v", &got, task)
	}
}

// TestCallbackRedactsSecrets: the callback URL is no authenticated caller, so the task posted
// to it carries its secret env values as "<redacted>" (plain ones intact), and the queued task
// itself is not changed.
func TestCallbackRedactsSecrets(t *testing.T) {
	srv := newServer(t, http.StatusOK)
	res := newFakeResolver()
	w, q := newWorker(t, res, callback.Config{})
	run(t, w)
	task := completed("t1", srv.URL+"/done")
	task.Definition.Env = []*modelsv1.EnvironmentVariable{{Name: "PLAIN", Value: "p"}, {Name: "TOKEN", Value: "cb-s3cr3t", Secret: true}}
	q.Enqueue(task)
	res.waitCalls(t, 2)
	body := srv.got()[0].body
	var got modelsv1.Task
	if err := protojson.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	env := got.GetDefinition().GetEnv()
	if strings.Contains(string(body), "cb-s3cr3t") || len(env) != 2 || env[0].GetValue() != "p" || env[1].GetValue() != "<redacted>" || !env[1].GetSecret() {
		t.Fatalf("callback body %s", body)
	}
	if task.GetDefinition().GetEnv()[1].GetValue() != "cb-s3cr3t" {
		t.Fatal("redaction changed the queued task")
	}
}

func TestGivesUpOnAnUnreachableURL(t *testing.T) {
	t.Run("unreachable", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		res := newFakeResolver()
		w, q := newWorker(t, res, callback.Config{Attempts: 2, Backoff: 5 * time.Millisecond})
		run(t, w)
		q.Enqueue(completed("t1", url))
		// Once given up, the task can be queued again (nothing is left in flight).
		srv2 := newServer(t, http.StatusOK)
		deadline := time.Now().Add(10 * time.Second)
		for len(res.got()) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("task never delivered after the first delivery gave up")
			}
			q.Enqueue(completed("t1", srv2.URL))
			time.Sleep(20 * time.Millisecond)
		}
		if calls := res.waitCalls(t, 2); !equal(calls, []string{"resolving t1", "delete t1"}) {
			t.Fatalf("resolver calls %v", calls)
		}
	})
}

func TestResolveRefusedSkipsDelete(t *testing.T) {
	for _, err := range []error{
		rpcerr.FailedPrecondition("task %q cannot be resolved in state RESOLVING", "t1"),
		rpcerr.NotFound("task %q not found", "t1"),
		errors.New("etcd down"),
	} {
		t.Run(err.Error(), func(t *testing.T) {
			srv := newServer(t, http.StatusOK)
			res := newFakeResolver()
			res.resolveErr = err
			w, q := newWorker(t, res, callback.Config{})
			run(t, w)
			q.Enqueue(completed("t1", srv.URL))
			res.waitCalls(t, 1)
			time.Sleep(100 * time.Millisecond)
			if calls := res.got(); !equal(calls, []string{"resolving t1"}) {
				t.Fatalf("resolver calls %v, want only the refused resolve", calls)
			}
		})
	}
}

func TestEnqueueDeduplicatesInFlight(t *testing.T) {
	srv := newServer(t, http.StatusOK)
	srv.hold = make(chan struct{})
	res := newFakeResolver()
	w, q := newWorker(t, res, callback.Config{Workers: 4})
	run(t, w)
	q.Enqueue(completed("t1", srv.URL))
	srv.waitRequests(t, 1)
	// Delivering: queuing it again is a no-op; another task goes through.
	q.Enqueue(completed("t1", srv.URL))
	q.Enqueue(completed("t2", srv.URL))
	srv.waitRequests(t, 2)
	srv.mu.Lock()
	close(srv.hold)
	srv.hold = nil
	srv.mu.Unlock()
	res.waitCalls(t, 4)
	time.Sleep(100 * time.Millisecond)
	if n := len(srv.got()); n != 2 {
		t.Fatalf("%d requests, want 2 (t1 once, t2 once)", n)
	}
	// Delivered: t1 may be queued again.
	q.Enqueue(completed("t1", srv.URL))
	srv.waitRequests(t, 3)
	res.waitCalls(t, 6)
}

func TestQueueFull(t *testing.T) {
	srv := newServer(t, http.StatusOK)
	res := newFakeResolver()
	w, q := newWorkerQueue(t, res, callback.Config{Workers: 1}, 2)
	// Not running yet: the queue fills up and further tasks are left for convergence.
	for _, guid := range []string{"t1", "t2", "t3", "t4"} {
		q.Enqueue(completed(guid, srv.URL))
	}
	run(t, w)
	// One worker takes the queue in order: once a task queued after the others is delivered,
	// t3 and t4 would have been delivered before it, had they been queued.
	res.waitCalls(t, 4)
	q.Enqueue(completed("fence", srv.URL))
	if calls := res.waitCalls(t, 6); !equal(calls, []string{"resolving t1", "delete t1", "resolving t2", "delete t2", "resolving fence", "delete fence"}) {
		t.Fatalf("resolver calls %v, want t1, t2 and the fence only", calls)
	}
	// A dropped task is not stuck as in flight: it can be queued again.
	q.Enqueue(completed("t3", srv.URL))
	if calls := res.waitCalls(t, 8); !equal(calls[6:], []string{"resolving t3", "delete t3"}) {
		t.Fatalf("resolver calls %v", calls)
	}
}

func TestBadURLIsPermanent(t *testing.T) {
	res := newFakeResolver()
	w, q := newWorker(t, res, callback.Config{Attempts: 5, Backoff: time.Hour})
	run(t, w)
	// Unparseable: the worker gives up at once instead of sleeping an hour between attempts.
	q.Enqueue(completed("t1", "http://[::1"))
	srv := newServer(t, http.StatusOK)
	deadline := time.Now().Add(5 * time.Second)
	for len(res.got()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a bad URL kept the task in flight")
		}
		q.Enqueue(completed("t1", srv.URL))
		time.Sleep(20 * time.Millisecond)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
