package cell

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/gavel-sched/gavel/internal/testkit"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

type strBatcher = batcher[*wrapperspb.StringValue, *wrapperspb.StringValue]

// fakeCalls records the single and batch calls a batcher makes; the first single call waits
// for release, so the items sent meanwhile queue.
type fakeCalls struct {
	mu       sync.Mutex
	singles  []string
	batches  [][]string
	release  chan struct{}
	batchErr error
}

func (f *fakeCalls) batcher() *strBatcher {
	return &strBatcher{
		base: context.Background(), callTimeout: time.Minute,
		one: func(ctx context.Context, r *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			f.mu.Lock()
			first := len(f.singles) == 0
			f.singles = append(f.singles, r.GetValue())
			f.mu.Unlock()
			if first {
				<-f.release
			}
			if r.GetValue() == "bad" {
				return nil, status.Error(codes.NotFound, "bad is not found")
			}
			return wrapperspb.String("ok " + r.GetValue()), nil
		},
		many: func(ctx context.Context, reqs []*wrapperspb.StringValue, _ []*modelsv1.TraceContext) ([]*wrapperspb.StringValue, []error, error) {
			var names []string
			for _, r := range reqs {
				names = append(names, r.GetValue())
			}
			f.mu.Lock()
			f.batches = append(f.batches, names)
			f.mu.Unlock()
			if f.batchErr != nil {
				return nil, nil, f.batchErr
			}
			out, errs := make([]*wrapperspb.StringValue, len(reqs)), make([]error, len(reqs))
			for i, n := range names {
				if n == "bad" {
					errs[i] = status.Error(codes.FailedPrecondition, "bad in a batch")
					continue
				}
				out[i] = wrapperspb.String("batched " + n)
			}
			return out, errs, nil
		},
	}
}

// waitQueued waits until n items are queued behind the call that is out.
func waitQueued(t *testing.T, b *strBatcher, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) >= n
	}, fmt.Sprintf("%d items queued", n))
}

type answer struct {
	resp string
	code codes.Code
}

// TestBatcherGroupsWhatQueuesBehindACall: an item alone goes out as its single call; the items
// that arrive while it is out go out together as one batch call when it returns, each answered
// with its own result or error; an item whose caller left before its batch went is not sent.
func TestBatcherGroupsWhatQueuesBehindACall(t *testing.T) {
	f := &fakeCalls{release: make(chan struct{})}
	b := f.batcher()
	answers := map[string]answer{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	send := func(ctx context.Context, name string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := b.do(ctx, wrapperspb.String(name))
			code := status.Code(err)
			mu.Lock()
			answers[name] = answer{resp.GetValue(), code}
			mu.Unlock()
		}()
	}
	send(context.Background(), "first")
	waitSingles(t, f, 1)
	gone, leave := context.WithCancel(context.Background())
	send(context.Background(), "a")
	waitQueued(t, b, 1)
	send(gone, "left")
	waitQueued(t, b, 2)
	send(context.Background(), "bad")
	waitQueued(t, b, 3)
	send(context.Background(), "b")
	waitQueued(t, b, 4)
	leave()
	close(f.release)
	wg.Wait()

	want := map[string]answer{
		"first": {"ok first", codes.OK}, "a": {"batched a", codes.OK}, "b": {"batched b", codes.OK},
		"bad": {"", codes.FailedPrecondition}, "left": {"", codes.Canceled},
	}
	for k, w := range want {
		if answers[k] != w {
			t.Errorf("%s answered %+v, want %+v", k, answers[k], w)
		}
	}
	if len(f.singles) != 1 || len(f.batches) != 1 || len(f.batches[0]) != 3 ||
		f.batches[0][0] != "a" || f.batches[0][1] != "bad" || f.batches[0][2] != "b" {
		t.Errorf("singles %v, batches %v; want [first] then one batch [a bad b]", f.singles, f.batches)
	}
}

// waitSingles waits until n single calls were made.
func waitSingles(t *testing.T, f *fakeCalls, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.singles) >= n
	}, fmt.Sprintf("%d single calls", n))
}

// TestBatcherFallsBackToSingleCalls: a BBS without the batch calls (Unimplemented) gets every
// item as its single call, now and from then on; any other failure of a batch call is every
// item's answer, for its caller's retry.
func TestBatcherFallsBackToSingleCalls(t *testing.T) {
	for _, tt := range []struct {
		name     string
		batchErr error
		want     codes.Code
		unbatch  bool
	}{
		{"unimplemented", status.Error(codes.Unimplemented, "unknown method ClaimActualLRPs"), codes.OK, true},
		{"busy", status.Error(codes.ResourceExhausted, "bbs busy"), codes.ResourceExhausted, false},
		{"down", errors.New("connection refused"), codes.Unknown, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCalls{release: make(chan struct{}), batchErr: tt.batchErr}
			b := f.batcher()
			codesGot := make(chan codes.Code, 3)
			var wg sync.WaitGroup
			for i, name := range []string{"first", "a", "b"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := b.do(context.Background(), wrapperspb.String(name))
					if i > 0 {
						codesGot <- status.Code(err)
					}
				}()
				if i == 0 {
					waitSingles(t, f, 1)
				} else {
					waitQueued(t, b, i)
				}
			}
			close(f.release)
			wg.Wait()
			close(codesGot)
			for c := range codesGot {
				if c != tt.want {
					t.Errorf("a queued item answered %s, want %s", c, tt.want)
				}
			}
			if b.unbatched.Load() != tt.unbatch {
				t.Errorf("unbatched = %v, want %v", b.unbatched.Load(), tt.unbatch)
			}
			if tt.unbatch {
				if _, err := b.do(context.Background(), wrapperspb.String("later")); err != nil {
					t.Fatal(err)
				}
				if f.singles[len(f.singles)-1] != "later" || len(f.batches) != 1 {
					t.Errorf("after Unimplemented: singles %v, batches %v", f.singles, f.batches)
				}
			}
		})
	}
}

// TestBatcherTimeoutIsAStatus: an item whose caller's deadline passes while it waits answers
// DeadlineExceeded as a gRPC status, as its single call would, so the caller's retry loop
// (retriable) tries it again instead of taking an unknown error for a refusal and dropping
// an instance whose claim may have landed.
func TestBatcherTimeoutIsAStatus(t *testing.T) {
	f := &fakeCalls{release: make(chan struct{})}
	b := f.batcher()
	go func() { _, _ = b.do(context.Background(), wrapperspb.String("first")) }()
	waitSingles(t, f, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := b.do(ctx, wrapperspb.String("late"))
	close(f.release)
	if status.Code(err) != codes.DeadlineExceeded || !retriable(err) {
		t.Fatalf("a timed-out item answered %v (code %s), want a retriable DeadlineExceeded status", err, status.Code(err))
	}
}
