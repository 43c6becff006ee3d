package reppool

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// rep is a real RepService on loopback whose State answers its cell id.
type rep struct {
	repv1.UnimplementedRepServiceServer
	id string
}

func (r *rep) State(context.Context, *repv1.StateRequest) (*repv1.StateResponse, error) {
	return &repv1.StateResponse{CellId: r.id}, nil
}

// startRep serves a rep for cell id on a loopback listener until the test ends.
func startRep(t *testing.T, id string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	repv1.RegisterRepServiceServer(srv, &rep{id: id})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

func presence(id, addr string) *modelsv1.CellPresence {
	return &modelsv1.CellPresence{CellId: id, RepAddress: addr}
}

// state calls State through c and returns the cell id it answered, or the call's error code.
func state(t *testing.T, c repv1.RepServiceClient) (string, codes.Code) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.State(ctx, &repv1.StateRequest{})
	return resp.GetCellId(), status.Code(err)
}

func newPool(t *testing.T) *Pool {
	p := New(grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}})
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestRetainEvictsDepartedCells(t *testing.T) {
	a, b := startRep(t, "cell-a"), startRep(t, "cell-b")
	p := newPool(t)
	ca, err := p.Presence(presence("cell-a", a))
	if err != nil {
		t.Fatal(err)
	}
	cb, err := p.Client("cell-b", b)
	if err != nil {
		t.Fatal(err)
	}
	if id, code := state(t, ca); id != "cell-a" || code != codes.OK {
		t.Fatalf("State of cell-a = %q, %v", id, code)
	}
	if id, code := state(t, cb); id != "cell-b" || code != codes.OK {
		t.Fatalf("State of cell-b = %q, %v", id, code)
	}
	if _, err := p.Client("cell-a", a); err != nil || p.Len() != 2 {
		t.Fatalf("a second Client for cell-a: %v, %d connections; want the same connection reused", err, p.Len())
	}

	// cell-a departs: its connection is closed, cell-b's is kept.
	p.Retain([]*modelsv1.CellPresence{presence("cell-b", b)})
	if p.Len() != 1 {
		t.Fatalf("%d connections after cell-a departed, want 1", p.Len())
	}
	if _, code := state(t, ca); code != codes.Canceled {
		t.Fatalf("State over the departed cell's connection: %v, want Canceled (connection closed)", code)
	}
	if id, code := state(t, cb); id != "cell-b" || code != codes.OK {
		t.Fatalf("State of the remaining cell-b = %q, %v", id, code)
	}

	// Evict closes one cell's connection.
	p.Evict("cell-b")
	if _, code := state(t, cb); code != codes.Canceled || p.Len() != 0 {
		t.Fatalf("after Evict: State %v, %d connections", code, p.Len())
	}
}

func TestMovedCellIsRedialled(t *testing.T) {
	old, moved := startRep(t, "cell-a"), startRep(t, "cell-a-moved")
	cases := []struct {
		name string
		move func(p *Pool) (repv1.RepServiceClient, error)
	}{
		{"on the next Client call", func(p *Pool) (repv1.RepServiceClient, error) { return p.Client("cell-a", moved) }},
		{"on Retain", func(p *Pool) (repv1.RepServiceClient, error) {
			p.Retain([]*modelsv1.CellPresence{presence("cell-a", moved)})
			if p.Len() != 0 {
				t.Fatalf("%d connections after the cell moved, want 0", p.Len())
			}
			return p.Client("cell-a", moved)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool(t)
			before, err := p.Client("cell-a", old)
			if err != nil {
				t.Fatal(err)
			}
			if id, _ := state(t, before); id != "cell-a" {
				t.Fatalf("State before the move = %q", id)
			}
			after, err := tc.move(p)
			if err != nil {
				t.Fatal(err)
			}
			if id, code := state(t, after); id != "cell-a-moved" || code != codes.OK {
				t.Fatalf("State after the move = %q, %v; want the rep at the new address", id, code)
			}
			if _, code := state(t, before); code != codes.Canceled {
				t.Fatalf("State over the old address: %v, want Canceled (connection closed)", code)
			}
			if p.Len() != 1 {
				t.Fatalf("%d connections, want 1", p.Len())
			}
		})
	}
}

func TestCloseClosesEverything(t *testing.T) {
	a := startRep(t, "cell-a")
	p := New(grpcx.ClientConfig{TLS: tlsx.Config{Insecure: true}})
	c, err := p.Client("cell-a", a)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, code := state(t, c); code != codes.Canceled || p.Len() != 0 {
		t.Fatalf("after Close: State %v, %d connections", code, p.Len())
	}
	if _, err := p.Client("cell-a", a); err == nil {
		t.Fatal("Client after Close succeeded")
	}
}

func TestConnectDialsBeforeTheFirstCall(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	p := newPool(t)
	p.Connect([]*modelsv1.CellPresence{presence("cell-a", l.Addr().String())})
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("Connect did not dial the cell's rep without a call")
	}
	p.Connect([]*modelsv1.CellPresence{presence("cell-a", l.Addr().String())})
	if p.Len() != 1 {
		t.Fatalf("%d connections after connecting one cell twice, want 1", p.Len())
	}
	// A cell that moved is connected at its new address, and its old connection closed.
	b := startRep(t, "cell-a")
	p.Connect([]*modelsv1.CellPresence{presence("cell-a", b)})
	c, err := p.Client("cell-a", b)
	if err != nil {
		t.Fatal(err)
	}
	if id, code := state(t, c); id != "cell-a" || code != codes.OK || p.Len() != 1 {
		t.Fatalf("State of the moved cell = %q, %v with %d connections", id, code, p.Len())
	}
}
