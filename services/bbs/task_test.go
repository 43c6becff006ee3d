package bbs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

const (
	taskPending   = modelsv1.Task_STATE_PENDING
	taskRunning   = modelsv1.Task_STATE_RUNNING
	taskCompleted = modelsv1.Task_STATE_COMPLETED
	taskResolving = modelsv1.Task_STATE_RESOLVING
	taskDeleted   = modelsv1.Task_STATE_UNSPECIFIED // the task no longer exists
)

func taskDefinition() *modelsv1.TaskDefinition {
	return &modelsv1.TaskDefinition{
		Rootfs:   "preloaded:cflinuxfs4",
		Action:   &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/bin/migrate"}}},
		MemoryMb: 64,
		DiskMb:   128,
		Labels:   map[string]string{"app": "migrate"},
	}
}

func taskDesire(t *testing.T, env *bbstest.Env, guid, domain string, def *modelsv1.TaskDefinition) {
	t.Helper()
	if _, err := env.Client.DesireTask(ctxT(t), &bbsv1.DesireTaskRequest{TaskGuid: guid, Domain: domain, Definition: def}); err != nil {
		t.Fatalf("DesireTask %s: %v", guid, err)
	}
}

// taskStored returns the stored task, or nil when it does not exist.
func taskStored(t *testing.T, env *bbstest.Env, guid string) *modelsv1.Task {
	t.Helper()
	resp, err := env.Client.TaskByGuid(ctxT(t), &bbsv1.TaskByGuidRequest{TaskGuid: guid})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		t.Fatalf("TaskByGuid %s: %v", guid, err)
	}
	return resp.GetTask()
}

// taskCall is one task RPC the lifecycle table makes.
type taskCall string

const (
	taskCallDesire        taskCall = "DesireTask"
	taskCallStartSame     taskCall = "StartTask same cell"
	taskCallStartOther    taskCall = "StartTask other cell"
	taskCallCancel        taskCall = "CancelTask"
	taskCallReject        taskCall = "RejectTask"
	taskCallCompleteRight taskCall = "CompleteTask right cell"
	taskCallCompleteWrong taskCall = "CompleteTask wrong cell"
	taskCallResolving     taskCall = "ResolvingTask"
	taskCallDelete        taskCall = "DeleteTask"
)

var taskAllCalls = []taskCall{taskCallDesire, taskCallStartSame, taskCallStartOther, taskCallCancel, taskCallReject, taskCallCompleteRight, taskCallCompleteWrong, taskCallResolving, taskCallDelete}

// The cell a RUNNING task of the lifecycle table runs on, and another cell.
const (
	taskCell      = "cell-1"
	taskOtherCell = "cell-2"
)

var taskRejectPE = &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES, Message: "insufficient resources: memory (2 compatible cells)"}

// taskDo performs call on guid and returns StartTask's should_start (false for other calls).
func taskDo(ctx context.Context, env *bbstest.Env, call taskCall, guid string) (bool, error) {
	c := env.Client
	var err error
	switch call {
	case taskCallDesire:
		_, err = c.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: guid, Domain: "tasks", Definition: taskDefinition()})
	case taskCallStartSame, taskCallStartOther:
		cell := taskCell
		if call == taskCallStartOther {
			cell = taskOtherCell
		}
		resp, err := c.StartTask(ctx, &bbsv1.StartTaskRequest{TaskGuid: guid, CellId: cell})
		return resp.GetShouldStart(), err
	case taskCallCancel:
		_, err = c.CancelTask(ctx, &bbsv1.CancelTaskRequest{TaskGuid: guid})
	case taskCallReject:
		_, err = c.RejectTask(ctx, &bbsv1.RejectTaskRequest{TaskGuid: guid, RejectionReason: "cell is full", PlacementError: taskRejectPE})
	case taskCallCompleteRight, taskCallCompleteWrong:
		cell := taskCell
		if call == taskCallCompleteWrong {
			cell = taskOtherCell
		}
		_, err = c.CompleteTask(ctx, &bbsv1.CompleteTaskRequest{TaskGuid: guid, CellId: cell, Failed: true, FailureReason: "exit status 2", Result: "partial"})
	case taskCallResolving:
		_, err = c.ResolvingTask(ctx, &bbsv1.ResolvingTaskRequest{TaskGuid: guid})
	case taskCallDelete:
		_, err = c.DeleteTask(ctx, &bbsv1.DeleteTaskRequest{TaskGuid: guid})
	default:
		panic("unknown call " + call)
	}
	return false, err
}

// taskInState creates guid and walks it to from ("missing" creates nothing).
func taskInState(t *testing.T, env *bbstest.Env, guid, from string) {
	t.Helper()
	ctx := ctxT(t)
	if from == "missing" {
		return
	}
	taskDesire(t, env, guid, "tasks", taskDefinition())
	if from == "pending" {
		return
	}
	if _, err := env.Client.StartTask(ctx, &bbsv1.StartTaskRequest{TaskGuid: guid, CellId: taskCell}); err != nil {
		t.Fatal(err)
	}
	if from == "running" {
		return
	}
	if _, err := env.Client.CompleteTask(ctx, &bbsv1.CompleteTaskRequest{TaskGuid: guid, CellId: taskCell, Result: "done"}); err != nil {
		t.Fatal(err)
	}
	if from == "completed" {
		return
	}
	if _, err := env.Client.ResolvingTask(ctx, &bbsv1.ResolvingTaskRequest{TaskGuid: guid}); err != nil {
		t.Fatal(err)
	}
	if from != "resolving" {
		t.Fatalf("unknown starting state %q", from)
	}
}

// taskOutcome is what one call on a task in one state must do.
type taskOutcome struct {
	code codes.Code
	// noop: the call succeeds without writing anything.
	noop bool
	// shouldStart is StartTask's answer.
	shouldStart bool
	// The stored task after a successful write (state taskDeleted: gone).
	state      modelsv1.Task_State
	cell       string
	failed     bool
	reason     string
	result     string
	rejections int32
	placement  bool
}

func taskRefused(code codes.Code) taskOutcome { return taskOutcome{code: code} }

func TestTaskLifecycleTransitions(t *testing.T) {
	env := bbstest.Start(t)
	fp := taskRefused(codes.FailedPrecondition)
	nf := taskRefused(codes.NotFound)
	exists := taskRefused(codes.AlreadyExists)
	cancelled := taskOutcome{state: taskCompleted, failed: true, reason: "task was cancelled"}
	rejected := taskOutcome{state: taskPending, reason: "cell is full", rejections: 1, placement: true}
	table := map[string]map[taskCall]taskOutcome{
		"pending": {
			taskCallDesire:        exists,
			taskCallStartSame:     {shouldStart: true, state: taskRunning, cell: taskCell},
			taskCallStartOther:    {shouldStart: true, state: taskRunning, cell: taskOtherCell},
			taskCallCancel:        cancelled,
			taskCallReject:        rejected,
			taskCallCompleteRight: fp,
			taskCallCompleteWrong: fp,
			taskCallResolving:     fp,
			taskCallDelete:        fp,
		},
		"running": {
			taskCallDesire:        exists,
			taskCallStartSame:     {noop: true, shouldStart: false},
			taskCallStartOther:    fp,
			taskCallCancel:        taskWithCell(cancelled, taskCell),
			taskCallReject:        rejected,
			taskCallCompleteRight: {state: taskCompleted, cell: taskCell, failed: true, reason: "exit status 2", result: "partial"},
			taskCallCompleteWrong: fp,
			taskCallResolving:     fp,
			taskCallDelete:        fp,
		},
		"completed": {
			taskCallDesire:        exists,
			taskCallStartSame:     fp,
			taskCallStartOther:    fp,
			taskCallCancel:        fp,
			taskCallReject:        fp,
			taskCallCompleteRight: fp,
			taskCallCompleteWrong: fp,
			taskCallResolving:     {state: taskResolving, cell: taskCell, result: "done"},
			taskCallDelete:        fp,
		},
		"resolving": {
			taskCallDesire:        exists,
			taskCallStartSame:     fp,
			taskCallStartOther:    fp,
			taskCallCancel:        fp,
			taskCallReject:        fp,
			taskCallCompleteRight: fp,
			taskCallCompleteWrong: fp,
			taskCallResolving:     fp,
			taskCallDelete:        {state: taskDeleted},
		},
		"missing": {
			taskCallDesire:        {state: taskPending},
			taskCallStartSame:     nf,
			taskCallStartOther:    nf,
			taskCallCancel:        nf,
			taskCallReject:        nf,
			taskCallCompleteRight: nf,
			taskCallCompleteWrong: nf,
			taskCallResolving:     nf,
			taskCallDelete:        nf,
		},
	}
	n := 0
	for _, from := range []string{"pending", "running", "completed", "resolving", "missing"} {
		for _, call := range taskAllCalls {
			want, ok := table[from][call]
			if !ok {
				t.Fatalf("table lacks %s from %s", call, from)
			}
			n++
			guid := fmt.Sprintf("t%02d", n)
			t.Run(from+"/"+string(call), func(t *testing.T) {
				taskCheckTransition(t, env, guid, from, call, want)
			})
		}
	}
}

func taskWithCell(o taskOutcome, cell string) taskOutcome {
	o.cell = cell
	return o
}

func taskCheckTransition(t *testing.T, env *bbstest.Env, guid, from string, call taskCall, want taskOutcome) {
	ctx := ctxT(t)
	taskInState(t, env, guid, from)
	before := taskStored(t, env, guid)
	revBefore := storeRevision(t, env)
	started := time.Now()

	shouldStart, err := taskDo(ctx, env, call, guid)
	wantCode(t, err, want.code)
	after := taskStored(t, env, guid)

	if want.code != codes.OK || want.noop {
		if rev := storeRevision(t, env); rev != revBefore {
			t.Fatalf("store changed: revision %d -> %d", revBefore, rev)
		}
		if !proto.Equal(before, after) {
			t.Fatalf("task changed:\nbefore %v\nafter  %v", before, after)
		}
		if call == taskCallStartSame || call == taskCallStartOther {
			if shouldStart != want.shouldStart {
				t.Fatalf("should_start %v, want %v", shouldStart, want.shouldStart)
			}
		}
		return
	}

	if storeRevision(t, env) == revBefore {
		t.Fatal("store revision did not move")
	}
	if call == taskCallStartSame || call == taskCallStartOther {
		if shouldStart != want.shouldStart {
			t.Fatalf("should_start %v, want %v", shouldStart, want.shouldStart)
		}
	}
	if want.state == taskDeleted {
		if after != nil {
			t.Fatalf("task not deleted: %v", after)
		}
		kvs, err := env.Etcd.Get(ctx, store.TaskKey(guid))
		if err != nil || len(kvs.Kvs) != 0 {
			t.Fatalf("task key left in etcd: %v %v", kvs.Kvs, err)
		}
		return
	}
	if after == nil {
		t.Fatal("task missing after the call")
	}
	got := taskOutcome{
		state:      after.GetState(),
		cell:       after.GetCellId(),
		failed:     after.GetFailed(),
		reason:     after.GetFailureReason(),
		result:     after.GetResult(),
		rejections: after.GetRejectionCount(),
		placement:  after.GetPlacementError() != nil,
	}
	w := want
	w.code, w.noop, w.shouldStart = 0, false, false
	if got != w {
		t.Fatalf("stored task:\n got %+v\nwant %+v\n(%v)", got, w, after)
	}
	if want.placement && !proto.Equal(after.GetPlacementError(), taskRejectPE) {
		t.Fatalf("placement error %v, want %v", after.GetPlacementError(), taskRejectPE)
	}
	if after.GetTaskGuid() != guid || after.GetDomain() != "tasks" || !proto.Equal(after.GetDefinition(), taskDefinition()) {
		t.Fatalf("identity or definition changed: %v", after)
	}
	if after.GetUpdatedAt() == nil || after.GetUpdatedAt().AsTime().Before(started.Add(-time.Second)) {
		t.Fatalf("updated_at not set by the call: %v", after.GetUpdatedAt())
	}

	if before == nil { // desired from nothing
		if after.GetModificationTag().GetEpoch() == "" || after.GetModificationTag().GetIndex() != 0 || after.GetCreatedAt() == nil {
			t.Fatalf("new task tag/created_at: %v", after)
		}
		return
	}
	if bt, at := before.GetModificationTag(), after.GetModificationTag(); at.GetEpoch() != bt.GetEpoch() || at.GetIndex() != bt.GetIndex()+1 {
		t.Fatalf("modification tag %v -> %v, want the index bumped", bt, at)
	}
	if !proto.Equal(after.GetCreatedAt(), before.GetCreatedAt()) {
		t.Fatal("created_at changed")
	}
	switch {
	case after.GetState() == taskCompleted:
		if after.GetFirstCompletedAt() == nil || !proto.Equal(after.GetFirstCompletedAt(), after.GetUpdatedAt()) {
			t.Fatalf("first_completed_at %v, want the completion time %v", after.GetFirstCompletedAt(), after.GetUpdatedAt())
		}
	case before.GetState() == taskCompleted:
		if before.GetFirstCompletedAt() == nil || !proto.Equal(after.GetFirstCompletedAt(), before.GetFirstCompletedAt()) {
			t.Fatalf("first_completed_at %v, want kept %v", after.GetFirstCompletedAt(), before.GetFirstCompletedAt())
		}
	default:
		if after.GetFirstCompletedAt() != nil {
			t.Fatalf("first_completed_at set on an incomplete task: %v", after.GetFirstCompletedAt())
		}
	}
}

func TestTaskRejectionLimit(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	reject := func(guid, reason string, pe *modelsv1.PlacementError) {
		t.Helper()
		if _, err := env.Client.RejectTask(ctx, &bbsv1.RejectTaskRequest{TaskGuid: guid, RejectionReason: reason, PlacementError: pe}); err != nil {
			t.Fatalf("RejectTask %s: %v", guid, err)
		}
	}

	t.Run("bbs default of 3", func(t *testing.T) {
		taskDesire(t, env, "default-limit", "tasks", taskDefinition())
		pe := &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_CELL_MISMATCH, Message: `found no compatible cell: 0/2 cells eligible (2 lack tag "gpu")`}
		for i := int32(1); i <= 2; i++ {
			// A cell rejects the task it was starting; the task waits for placement again.
			if _, err := env.Client.StartTask(ctx, &bbsv1.StartTaskRequest{TaskGuid: "default-limit", CellId: taskCell}); err != nil {
				t.Fatal(err)
			}
			reject("default-limit", "", pe)
			got := taskStored(t, env, "default-limit")
			if got.GetState() != taskPending || got.GetRejectionCount() != i || got.GetCellId() != "" || got.GetFailed() ||
				!proto.Equal(got.GetPlacementError(), pe) || got.GetFailureReason() != pe.GetMessage() {
				t.Fatalf("after rejection %d: %v", i, got)
			}
		}
		reject("default-limit", "", pe)
		got := taskStored(t, env, "default-limit")
		if got.GetState() != taskCompleted || !got.GetFailed() || got.GetRejectionCount() != 3 || got.GetFirstCompletedAt() == nil {
			t.Fatalf("after the 3rd rejection: %v", got)
		}
		if want := "task was rejected 3 times: " + pe.GetMessage(); got.GetFailureReason() != want {
			t.Fatalf("failure_reason %q, want %q", got.GetFailureReason(), want)
		}
		// A completed task cannot be rejected again.
		before := storeRevision(t, env)
		_, err := env.Client.RejectTask(ctx, &bbsv1.RejectTaskRequest{TaskGuid: "default-limit", RejectionReason: "again"})
		wantCode(t, err, codes.FailedPrecondition)
		if storeRevision(t, env) != before {
			t.Fatal("refused rejection changed the store")
		}
	})

	t.Run("task's own limit", func(t *testing.T) {
		def := taskDefinition()
		def.MaxRejections = 5
		taskDesire(t, env, "own-limit", "tasks", def)
		for i := int32(1); i < 5; i++ {
			reject("own-limit", fmt.Sprintf("no room %d", i), nil)
			got := taskStored(t, env, "own-limit")
			if got.GetState() != taskPending || got.GetRejectionCount() != i || got.GetPlacementError() != nil || got.GetFailureReason() != fmt.Sprintf("no room %d", i) {
				t.Fatalf("after rejection %d: %v", i, got)
			}
		}
		reject("own-limit", "no room 5", nil)
		got := taskStored(t, env, "own-limit")
		if got.GetState() != taskCompleted || !got.GetFailed() || got.GetRejectionCount() != 5 || got.GetFailureReason() != "task was rejected 5 times: no room 5" {
			t.Fatalf("after the 5th rejection: %v", got)
		}
	})

	t.Run("limit of 1", func(t *testing.T) {
		def := taskDefinition()
		def.MaxRejections = 1
		taskDesire(t, env, "one-shot", "tasks", def)
		reject("one-shot", "nope", nil)
		if got := taskStored(t, env, "one-shot"); got.GetState() != taskCompleted || !got.GetFailed() || got.GetRejectionCount() != 1 {
			t.Fatalf("after the only rejection: %v", got)
		}
	})
}

func TestTasksListFilters(t *testing.T) {
	env := bbstest.Start(t)
	ctx := ctxT(t)
	for _, spec := range []struct{ guid, domain, tier, cell string }{
		{"a", "batch", "web", taskCell},
		{"b", "batch", "db", ""},
		{"c", "other", "web", taskOtherCell},
		{"d", "other", "db", taskCell},
	} {
		def := taskDefinition()
		def.Labels = map[string]string{"tier": spec.tier, "task": spec.guid}
		taskDesire(t, env, spec.guid, spec.domain, def)
		if spec.cell != "" {
			if _, err := env.Client.StartTask(ctx, &bbsv1.StartTaskRequest{TaskGuid: spec.guid, CellId: spec.cell}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name   string
		filter *bbsv1.Filter
		want   []string
	}{
		{"all", nil, []string{"a", "b", "c", "d"}},
		{"empty filter", &bbsv1.Filter{}, []string{"a", "b", "c", "d"}},
		{"domain", &bbsv1.Filter{Domain: "batch"}, []string{"a", "b"}},
		{"unknown domain", &bbsv1.Filter{Domain: "nope"}, nil},
		{"task guids", &bbsv1.Filter{ProcessGuids: []string{"d", "b", "zzz"}}, []string{"b", "d"}},
		{"cell", &bbsv1.Filter{CellId: taskCell}, []string{"a", "d"}},
		{"cell and domain", &bbsv1.Filter{CellId: taskCell, Domain: "other"}, []string{"d"}},
		{"selector eq", &bbsv1.Filter{LabelSelector: "tier=web"}, []string{"a", "c"}},
		{"selector ne and in", &bbsv1.Filter{LabelSelector: "tier!=web,task in (b,c,d)"}, []string{"b", "d"}},
		{"selector and guids", &bbsv1.Filter{LabelSelector: "tier=db", ProcessGuids: []string{"a", "b"}}, []string{"b"}},
		{"selector no match", &bbsv1.Filter{LabelSelector: "!tier"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := env.Client.Tasks(ctx, &bbsv1.TasksRequest{Filter: tt.filter})
			if err != nil {
				t.Fatal(err)
			}
			var guids []string
			for _, task := range resp.GetTasks() {
				guids = append(guids, task.GetTaskGuid())
			}
			if fmt.Sprint(guids) != fmt.Sprint(tt.want) {
				t.Fatalf("tasks %v, want %v", guids, tt.want)
			}
			if resp.GetRevision() == 0 {
				t.Fatal("Tasks must return the revision it read")
			}
		})
	}
	_, err := env.Client.Tasks(ctx, &bbsv1.TasksRequest{Filter: &bbsv1.Filter{LabelSelector: "tier in (a"}})
	wantCode(t, err, codes.InvalidArgument)
	_, err = env.Client.TaskByGuid(ctx, &bbsv1.TaskByGuidRequest{TaskGuid: "missing"})
	wantCode(t, err, codes.NotFound)
}

// taskCallbackServer records the completion callbacks it receives and answers each with the next
// status of answers (the last one repeats).
type taskCallbackServer struct {
	*httptest.Server
	mu       sync.Mutex
	answers  []int
	requests []taskCallbackRequest
	received chan struct{}
}

type taskCallbackRequest struct {
	method, contentType string
	body                []byte
}

func taskNewCallbackServer(t *testing.T, answers ...int) *taskCallbackServer {
	s := &taskCallbackServer{answers: answers, received: make(chan struct{}, 100)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.requests = append(s.requests, taskCallbackRequest{r.Method, r.Header.Get("Content-Type"), body})
		code := s.answers[min(len(s.requests), len(s.answers))-1]
		s.mu.Unlock()
		w.WriteHeader(code)
		s.received <- struct{}{}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *taskCallbackServer) got() []taskCallbackRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]taskCallbackRequest(nil), s.requests...)
}

// waitRequests waits until the server has received n requests.
func (s *taskCallbackServer) waitRequests(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for len(s.got()) < n {
		select {
		case <-s.received:
		case <-deadline:
			t.Fatalf("callback server got %d requests within %v, want %d", len(s.got()), within, n)
		}
	}
}

// taskWaitGone polls TaskByGuid until NotFound.
func taskWaitGone(t *testing.T, env *bbstest.Env, guid string, within time.Duration) {
	t.Helper()
	testkit.Eventually(t, within, func() bool {
		_, err := env.Client.TaskByGuid(ctxT(t), &bbsv1.TaskByGuidRequest{TaskGuid: guid})
		if err != nil && status.Code(err) != codes.NotFound {
			t.Fatalf("TaskByGuid: %v", err)
		}
		return status.Code(err) == codes.NotFound
	}, fmt.Sprintf("task %s deleted after its callback", guid))
}

// taskDecodeCallback checks one callback request and decodes its task.
func taskDecodeCallback(t *testing.T, r taskCallbackRequest) *modelsv1.Task {
	t.Helper()
	if r.method != http.MethodPost || r.contentType != "application/json" {
		t.Fatalf("callback %s with Content-Type %q, want POST application/json", r.method, r.contentType)
	}
	var raw map[string]any
	if err := json.Unmarshal(r.body, &raw); err != nil {
		t.Fatalf("callback body is not JSON: %v: %s", err, r.body)
	}
	if _, ok := raw["taskGuid"]; !ok {
		t.Fatalf("callback body lacks protojson's taskGuid: %s", r.body)
	}
	var task modelsv1.Task
	if err := protojson.Unmarshal(r.body, &task); err != nil {
		t.Fatalf("callback body is not a task: %v: %s", err, r.body)
	}
	return &task
}

func taskWithCallback(t *testing.T, env *bbstest.Env, guid, url string) {
	t.Helper()
	def := taskDefinition()
	def.CompletionCallbackUrl = url
	taskDesire(t, env, guid, "tasks", def)
}

func taskRunAndComplete(t *testing.T, env *bbstest.Env, guid string) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := env.Client.StartTask(ctx, &bbsv1.StartTaskRequest{TaskGuid: guid, CellId: taskCell}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CompleteTask(ctx, &bbsv1.CompleteTaskRequest{TaskGuid: guid, CellId: taskCell, Result: "42 rows migrated"}); err != nil {
		t.Fatal(err)
	}
}

func TestTaskCompletionCallback(t *testing.T) {
	// One callback worker delivers in queue order, each delivery's retries included, so a
	// callback that arrives proves every task completed before it is done with (see "400 is
	// not retried").
	env := bbstest.Start(t, func(c *bbs.Config) { c.CallbackWorkers = 1 })

	t.Run("delivered then deleted", func(t *testing.T) {
		srv := taskNewCallbackServer(t, http.StatusOK)
		taskWithCallback(t, env, "cb-ok", srv.URL+"/done?token=x")
		taskRunAndComplete(t, env, "cb-ok")
		srv.waitRequests(t, 1, 10*time.Second)
		task := taskDecodeCallback(t, srv.got()[0])
		if task.GetTaskGuid() != "cb-ok" || task.GetState() != taskCompleted || task.GetResult() != "42 rows migrated" || task.GetFailed() || task.GetCellId() != taskCell {
			t.Fatalf("callback task: %v", task)
		}
		var raw map[string]any
		if err := json.Unmarshal(srv.got()[0].body, &raw); err != nil || raw["state"] != "STATE_COMPLETED" || raw["taskGuid"] != "cb-ok" || raw["result"] != "42 rows migrated" {
			t.Fatalf("callback body: %s (%v)", srv.got()[0].body, err)
		}
		taskWaitGone(t, env, "cb-ok", 10*time.Second)
		if n := len(srv.got()); n != 1 {
			t.Fatalf("%d callbacks, want 1", n)
		}
	})

	t.Run("retried after 503", func(t *testing.T) {
		srv := taskNewCallbackServer(t, http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusOK)
		taskWithCallback(t, env, "cb-retry", srv.URL)
		taskRunAndComplete(t, env, "cb-retry")
		srv.waitRequests(t, 3, 15*time.Second)
		taskWaitGone(t, env, "cb-retry", 10*time.Second)
		for i, r := range srv.got() {
			if task := taskDecodeCallback(t, r); task.GetTaskGuid() != "cb-retry" {
				t.Fatalf("attempt %d: %v", i, task)
			}
		}
		if n := len(srv.got()); n != 3 {
			t.Fatalf("%d callbacks, want 3", n)
		}
	})

	t.Run("400 is not retried", func(t *testing.T) {
		srv := taskNewCallbackServer(t, http.StatusBadRequest)
		taskWithCallback(t, env, "cb-bad", srv.URL)
		taskRunAndComplete(t, env, "cb-bad")
		srv.waitRequests(t, 1, 10*time.Second)
		// A task completed after cb-bad's callback was answered is queued behind cb-bad; the
		// one worker reaches it only once cb-bad's delivery, with any retry, is over.
		fence := taskNewCallbackServer(t, http.StatusOK)
		taskWithCallback(t, env, "cb-fence", fence.URL)
		taskRunAndComplete(t, env, "cb-fence")
		fence.waitRequests(t, 1, 10*time.Second)
		if n := len(srv.got()); n != 1 {
			t.Fatalf("%d callbacks after a 400, want 1", n)
		}
		if got := taskStored(t, env, "cb-bad"); got.GetState() != taskCompleted {
			t.Fatalf("task after an undelivered callback: %v", got)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		srv := taskNewCallbackServer(t, http.StatusNoContent)
		taskWithCallback(t, env, "cb-cancel", srv.URL)
		if _, err := env.Client.CancelTask(ctxT(t), &bbsv1.CancelTaskRequest{TaskGuid: "cb-cancel"}); err != nil {
			t.Fatal(err)
		}
		srv.waitRequests(t, 1, 10*time.Second)
		task := taskDecodeCallback(t, srv.got()[0])
		if task.GetTaskGuid() != "cb-cancel" || task.GetState() != taskCompleted || !task.GetFailed() || task.GetFailureReason() != "task was cancelled" {
			t.Fatalf("callback task: %v", task)
		}
		taskWaitGone(t, env, "cb-cancel", 10*time.Second)
	})

	t.Run("rejected too often", func(t *testing.T) {
		srv := taskNewCallbackServer(t, http.StatusOK)
		def := taskDefinition()
		def.CompletionCallbackUrl = srv.URL
		def.MaxRejections = 1
		taskDesire(t, env, "cb-reject", "tasks", def)
		if _, err := env.Client.RejectTask(ctxT(t), &bbsv1.RejectTaskRequest{TaskGuid: "cb-reject", RejectionReason: "no cell"}); err != nil {
			t.Fatal(err)
		}
		srv.waitRequests(t, 1, 10*time.Second)
		if task := taskDecodeCallback(t, srv.got()[0]); !task.GetFailed() || task.GetRejectionCount() != 1 {
			t.Fatalf("callback task: %v", task)
		}
		taskWaitGone(t, env, "cb-reject", 10*time.Second)
	})
}
