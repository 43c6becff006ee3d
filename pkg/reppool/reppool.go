// Package reppool keeps one gRPC client connection per cell to the cell's rep, shared by the
// services that call reps (the auctioneer and the BBS). A connection is keyed by the cell id
// and remembers the rep address it was dialled to: it is closed when the cell departs (Retain
// with the present cells, or Evict) or when the cell registers at another address (the next
// Client call for it redials), and every connection is closed by Close.
package reppool

import (
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
)

// Pool is a set of rep connections keyed by cell id. It is safe for concurrent use.
type Pool struct {
	cfg  grpcx.ClientConfig
	opts []grpc.DialOption

	mu     sync.Mutex
	conns  map[string]*conn // by cell id
	closed bool
}

// conn is one cell's connection and the address it was dialled to.
type conn struct {
	address string
	cc      *grpc.ClientConn
}

// New returns a pool dialling reps with cfg (mutual TLS, or insecure for development) and
// opts (e.g. interceptors).
func New(cfg grpcx.ClientConfig, opts ...grpc.DialOption) *Pool {
	return &Pool{cfg: cfg, opts: opts, conns: map[string]*conn{}}
}

// Client returns a client of the rep of cell cellID at address, dialling on first use. A cell
// whose address changed since its connection was dialled gets a new connection; the old one
// is closed.
func (p *Pool) Client(cellID, address string) (repv1.RepServiceClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, err := p.connLocked(cellID, address)
	if err != nil {
		return nil, err
	}
	return repv1.NewRepServiceClient(c.cc), nil
}

// Connect makes sure every present cell has a connection and starts connecting those that are
// not connected (new or idle ones) in the background, without waiting: the TLS handshakes of a
// thousand new cells then happen before work is placed on them, not during the first call.
// Dial errors (an address that does not parse) are left to the first call to report.
func (p *Pool) Connect(present []*modelsv1.CellPresence) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cell := range present {
		if c, err := p.connLocked(cell.GetCellId(), cell.GetRepAddress()); err == nil {
			c.cc.Connect()
		}
	}
}

// connLocked is the connection to cellID's rep at address, dialled (lazily) when there is none
// or the cell moved. p.mu must be held.
func (p *Pool) connLocked(cellID, address string) (*conn, error) {
	if p.closed {
		return nil, fmt.Errorf("rep of cell %s at %s: the rep pool is closed", cellID, address)
	}
	c, ok := p.conns[cellID]
	if ok && c.address != address {
		// Closing a connection nobody should use any more cannot fail in a way we could act on.
		_ = c.cc.Close()
		delete(p.conns, cellID)
		ok = false
	}
	if !ok {
		cc, err := grpcx.Dial(address, p.cfg, p.opts...)
		if err != nil {
			return nil, fmt.Errorf("dial rep of cell %s at %s: %w", cellID, address, err)
		}
		c = &conn{address: address, cc: cc}
		p.conns[cellID] = c
	}
	return c, nil
}

// Presence returns a client of the rep of a registered cell (Client with its id and address).
func (p *Pool) Presence(cell *modelsv1.CellPresence) (repv1.RepServiceClient, error) {
	return p.Client(cell.GetCellId(), cell.GetRepAddress())
}

// Retain closes the connections of cells that are not among present (they departed) and of
// cells that are present at another address than their connection's.
func (p *Pool) Retain(present []*modelsv1.CellPresence) {
	keep := make(map[string]string, len(present))
	for _, c := range present {
		keep[c.GetCellId()] = c.GetRepAddress()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, c := range p.conns {
		if addr, ok := keep[id]; !ok || addr != c.address {
			_ = c.cc.Close()
			delete(p.conns, id)
		}
	}
}

// Evict closes the connection of one cell, if any (the cell departed).
func (p *Pool) Evict(cellID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[cellID]; ok {
		_ = c.cc.Close()
		delete(p.conns, cellID)
	}
}

// Len is the number of open connections.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close closes every connection; later Client calls fail.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	for id, c := range p.conns {
		if err := c.cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close rep of cell %s at %s: %w", id, c.address, err))
		}
		delete(p.conns, id)
	}
	return errors.Join(errs...)
}
