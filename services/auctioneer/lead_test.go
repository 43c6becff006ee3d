package auctioneer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/auction"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/batch"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

// The tests of this file drive the leader's loop on synctest's fake clock: the batch interval
// and the retry delay of failed rounds are checked exactly, without sleeping. The BBS is an
// in-memory fake listing no cells (so every round reports its work unplaceable).

// cellsBBS records when rounds listed cells, failing the first failures listings.
type cellsBBS struct {
	mu       sync.Mutex
	failures int
	listed   []time.Time
	rejected int
}

func (b *cellsBBS) Cells(context.Context, *bbsv1.CellsRequest, ...grpc.CallOption) (*bbsv1.CellsResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.listed = append(b.listed, time.Now())
	if len(b.listed) <= b.failures {
		return nil, errors.New("bbs down")
	}
	return &bbsv1.CellsResponse{}, nil
}

func (b *cellsBBS) FailActualLRP(context.Context, *bbsv1.FailActualLRPRequest, ...grpc.CallOption) (*bbsv1.FailActualLRPResponse, error) {
	return &bbsv1.FailActualLRPResponse{}, nil
}

func (b *cellsBBS) RejectTask(context.Context, *bbsv1.RejectTaskRequest, ...grpc.CallOption) (*bbsv1.RejectTaskResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rejected++
	return &bbsv1.RejectTaskResponse{}, nil
}

// offsets are the listing times relative to start.
func (b *cellsBBS) offsets(start time.Time) []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []time.Duration
	for _, at := range b.listed {
		out = append(out, at.Sub(start))
	}
	return out
}

// noReps is never asked: the fake BBS lists no cells.
type noReps struct{}

func (noReps) Client(string, string) (repv1.RepServiceClient, error) {
	return nil, errors.New("no reps")
}

// leading runs a leader's loop over bbs inside the current bubble and returns the service and
// a function that stops the loop and checks it ended cleanly.
func leading(t *testing.T, bbs *cellsBBS) (*Service, func()) {
	t.Helper()
	server, err := grpcx.NewServer(grpcx.ServerConfig{ListenAddress: "127.0.0.1:0", TLS: tlsx.Config{Insecure: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{
		cfg:     Config{BatchInterval: Duration(50 * time.Millisecond)},
		log:     logtest.New(t),
		batch:   batch.New(),
		runner:  auction.NewRunner(bbs, noReps{}, auction.Config{}, logtest.New(t)),
		server:  server,
		metrics: newServiceMetrics(),
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.lead(ctx) }()
	synctest.Wait() // leading, idle: waiting for work
	return s, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("lead: %v", err)
		}
	}
}

func task(guid string) *placement.Work {
	return &placement.Work{Kind: placement.KindTask, TaskGuid: guid, MemoryMB: 64}
}

func TestLeaderRoundsAtMostOncePerBatchInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bbs := &cellsBBS{}
		s, stop := leading(t, bbs)
		defer stop()
		start := time.Now()
		s.batch.Add(task("t1")) // idle: the round starts at once
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		s.batch.Add(task("t2"), task("t3")) // 10ms later: waits for the interval, one round for both
		time.Sleep(time.Second)
		synctest.Wait()
		got := bbs.offsets(start)
		if len(got) != 2 || got[0] != 0 || got[1] != 50*time.Millisecond {
			t.Fatalf("rounds listed cells at %v, want [0s 50ms]", got)
		}
		if s.Rounds() != 2 || bbs.rejected != 3 {
			t.Fatalf("%d rounds, %d tasks rejected; want 2 rounds, 3 rejected", s.Rounds(), bbs.rejected)
		}
	})
}

func TestLeaderRetriesARoundThatCouldNotListCells(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int
		want     []time.Duration // when rounds listed cells
		rejected int             // tasks reported unplaceable (0: dropped for convergence)
	}{
		{"recovers", 1, []time.Duration{0, roundRetryDelay}, 1},
		{"gives up after maxRoundAttempts", 10, []time.Duration{0, roundRetryDelay, 2 * roundRetryDelay}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				bbs := &cellsBBS{failures: tc.failures}
				s, stop := leading(t, bbs)
				defer stop()
				start := time.Now()
				s.batch.Add(task("t1"))
				time.Sleep(time.Minute)
				synctest.Wait()
				got := bbs.offsets(start)
				if len(got) != len(tc.want) {
					t.Fatalf("rounds listed cells at %v, want %v", got, tc.want)
				}
				for i := range got {
					if got[i] != tc.want[i] {
						t.Fatalf("rounds listed cells at %v, want %v", got, tc.want)
					}
				}
				if bbs.rejected != tc.rejected || s.batch.Len() != 0 {
					t.Fatalf("%d rejected, %d left queued; want %d, 0", bbs.rejected, s.batch.Len(), tc.rejected)
				}
			})
		})
	}
}
