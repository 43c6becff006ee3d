package grpcx

import (
	"context"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// frameCounter counts the HTTP/2 frames of one direction of a plaintext connection by type.
type frameCounter struct {
	mu     sync.Mutex
	counts map[http2.FrameType]int
	pw     *io.PipeWriter
	done   chan struct{}
}

// newFrameCounter parses what is written to it as HTTP/2 frames, after skipping the first
// skip bytes (a client's connection preface).
func newFrameCounter(skip int) *frameCounter {
	pr, pw := io.Pipe()
	c := &frameCounter{counts: map[http2.FrameType]int{}, pw: pw, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if _, err := io.CopyN(io.Discard, pr, int64(skip)); err != nil {
			return
		}
		fr := http2.NewFramer(nil, pr)
		fr.SetMaxReadFrameSize(1 << 24)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				_ = pr.CloseWithError(err)
				return
			}
			c.mu.Lock()
			c.counts[f.Header().Type]++
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *frameCounter) count(t http2.FrameType) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[t]
}

// wait waits (at most 5 s) for the counter to have parsed everything written to it, once its
// connection is closed.
func (c *frameCounter) wait(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the frame counter did not finish")
	}
}

// tappedConn copies each direction of a connection to a frame counter.
type tappedConn struct {
	net.Conn
	in, out *frameCounter
}

func (c *tappedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		_, _ = c.in.pw.Write(p[:n])
	}
	return n, err
}

func (c *tappedConn) Close() error {
	err := c.Conn.Close()
	_ = c.in.pw.Close()
	_ = c.out.pw.Close()
	return err
}

func (c *tappedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		_, _ = c.out.pw.Write(p[:n])
	}
	return n, err
}

// TestSparseCallsSendNoPings checks that a connection with a call now and then carries no
// PING frames either way: with gRPC's dynamic windows, data arriving on a connection with no
// BDP PING outstanding sends one (and its ack comes back), so each such call cost four
// frames more, on the BBS's connection to every rep.
func TestSparseCallsSendNoPings(t *testing.T) {
	r := start(t, ServerConfig{TLS: tlsx.Config{Insecure: true}}, nil)
	var tapped *tappedConn
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		tapped = &tappedConn{Conn: c, in: newFrameCounter(0), out: newFrameCounter(len(http2.ClientPreface))}
		return tapped, nil
	}
	conn := dial(t, r, insecureClient, grpc.WithContextDialer(dialer))
	ctx := testContext(t)
	const calls = 10
	for range calls {
		if err := call(ctx, conn, "Echo", ""); err != nil {
			t.Fatal(err)
		}
		// Long enough for a PING's ack to return, so that the next call's data would
		// start a new one.
		time.Sleep(20 * time.Millisecond)
	}
	conn.Close()
	tapped.in.wait(t)
	tapped.out.wait(t)
	if got := tapped.in.count(http2.FrameData); got != calls {
		t.Fatalf("the client read %d DATA frames, want %d (the tap misses frames)", got, calls)
	}
	if in, out := tapped.in.count(http2.FramePing), tapped.out.count(http2.FramePing); in != 0 || out != 0 {
		t.Errorf("%d calls: %d PING frames from the server, %d from the client; want none", calls, in, out)
	}
}

// BenchmarkSparseCallsMutualTLS makes calls round-robin over many mutual-TLS connections, one
// call on each at a time, as the BBS serves its reps, and reports the process's CPU per call
// (client and server together).
func BenchmarkSparseCallsMutualTLS(b *testing.B) {
	pki, err := tlsx.GenerateDevPKI(b.TempDir(), "server", "rep/cell-1")
	if err != nil {
		b.Fatal(err)
	}
	// A null logger, as the server had before: the test logger would log each call.
	r := start(b, ServerConfig{TLS: pki["server"]}, hclog.NewNullLogger())
	ctx := context.Background()
	const conns = 200
	cs := make([]*grpc.ClientConn, conns)
	for i := range cs {
		cs[i] = dial(b, r, ClientConfig{TLS: pki["rep/cell-1"]})
		if err := call(ctx, cs[i], "Echo", ""); err != nil {
			b.Fatal(err)
		}
	}
	before := cpuTime()
	b.ResetTimer()
	for i := range b.N {
		if err := call(ctx, cs[i%conns], "Echo", ""); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/call")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
