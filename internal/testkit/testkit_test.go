package testkit

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// recorder is a testing.TB that records failures instead of ending the test.
type recorder struct {
	testing.TB
	failed atomic.Bool
	msg    atomic.Value
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed.Store(true)
	r.msg.Store(format)
	panic(errFatal)
}
func (r *recorder) Errorf(format string, args ...any) { r.failed.Store(true); r.msg.Store(format) }

var errFatal = errors.New("fatal")

// catch runs f, absorbing the panic recorder.Fatalf raises.
func catch(f func()) {
	defer func() {
		if p := recover(); p != nil && p != errFatal {
			panic(p)
		}
	}()
	f()
}

func TestEventually(t *testing.T) {
	var n atomic.Int32
	Eventually(t, 5*time.Second, func() bool { return n.Add(1) == 3 }, "three polls")
	if n.Load() != 3 {
		t.Fatalf("polled %d times, want 3", n.Load())
	}

	r := &recorder{TB: t}
	start := time.Now()
	catch(func() {
		EventuallyState(r, 50*time.Millisecond, func() (bool, string) { return false, "still false" }, "never")
	})
	if !r.failed.Load() {
		t.Fatal("a condition that never holds did not fail the test")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %s, before the timeout", d)
	}
}

func TestListenIsBoundAndClosedAtCleanup(t *testing.T) {
	var l net.Listener
	var pc net.PacketConn
	t.Run("inner", func(t *testing.T) {
		l, pc = Listen(t), ListenPacket(t)
		if Port(l.Addr()) == 0 || Port(pc.LocalAddr()) == 0 {
			t.Fatalf("ports %v %v", l.Addr(), pc.LocalAddr())
		}
		// Bound: a second listener on the same port fails.
		if l2, err := net.Listen("tcp", l.Addr().String()); err == nil {
			l2.Close()
			t.Fatal("the listener's port could be bound again")
		}
	})
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after the test ended: %v, want the listener closed", err)
	}
	if _, _, err := pc.ReadFrom(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("ReadFrom after the test ended: %v, want the connection closed", err)
	}
}

// service is a Runner whose Run the test controls.
type service struct {
	failReady bool
	stopErr   error
	stopped   atomic.Bool
}

func (s *service) Run(ctx context.Context, ready func()) error {
	if s.failReady {
		return errors.New("bad config")
	}
	ready()
	<-ctx.Done()
	s.stopped.Store(true)
	return s.stopErr
}

func TestStartStopsAndJoinsAtCleanup(t *testing.T) {
	s := &service{}
	t.Run("inner", func(t *testing.T) {
		Start(t, "svc", s)
		if s.stopped.Load() {
			t.Fatal("stopped before the test ended")
		}
	})
	if !s.stopped.Load() {
		t.Fatal("not stopped and joined when the test ended")
	}
}

func TestStartReports(t *testing.T) {
	t.Run("run fails before ready", func(t *testing.T) {
		r := &recorder{TB: t}
		catch(func() { Start(r, "svc", &service{failReady: true}) })
		if !r.failed.Load() {
			t.Fatal("a service that failed to start did not fail the test")
		}
	})
	t.Run("stop error", func(t *testing.T) {
		s := &service{stopErr: errors.New("unclean")}
		run := Start(t, "svc", s)
		if err := run.Stop(); err == nil || err.Error() != "unclean" {
			t.Fatalf("Stop = %v, want the Run error", err)
		}
		if err := run.Stop(); err == nil {
			t.Fatal("a second Stop lost the error")
		}
	})
}

func TestScrape(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		wantFail bool
	}{
		{"served", http.StatusOK, false},
		{"server error", http.StatusInternalServerError, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/metrics" {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte("up 1\n"))
			})}
			l := Listen(t)
			go func() { _ = srv.Serve(l) }()
			t.Cleanup(func() { _ = srv.Close() })
			r := &recorder{TB: t}
			var got string
			catch(func() { got = Scrape(r, l.Addr()) })
			if r.failed.Load() != tt.wantFail {
				t.Fatalf("Scrape failed = %v, want %v", r.failed.Load(), tt.wantFail)
			}
			if !tt.wantFail && got != "up 1\n" {
				t.Fatalf("Scrape = %q, want %q", got, "up 1\n")
			}
		})
	}
}

func TestDialReachesALoopbackServer(t *testing.T) {
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	l := Listen(t)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	conn := Dial(t, l.Addr().String())
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check over Dial: %v %v", resp, err)
	}
}
