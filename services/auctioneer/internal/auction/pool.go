package auction

import (
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"

	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
)

// Pool keeps one gRPC client connection per rep address, dialled on first use. It is safe for
// concurrent use.
type Pool struct {
	cfg   grpcx.ClientConfig
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewPool returns a pool dialling reps with cfg (mutual TLS, or insecure for development).
func NewPool(cfg grpcx.ClientConfig) *Pool {
	return &Pool{cfg: cfg, conns: map[string]*grpc.ClientConn{}}
}

// Rep returns a client of the rep at address.
func (p *Pool) Rep(address string) (repv1.RepServiceClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	conn, ok := p.conns[address]
	if !ok {
		var err error
		if conn, err = grpcx.Dial(address, p.cfg); err != nil {
			return nil, fmt.Errorf("dial rep %s: %w", address, err)
		}
		p.conns[address] = conn
	}
	return repv1.NewRepServiceClient(conn), nil
}

// Retain closes the connections of reps whose address is not in keep (cells that left).
func (p *Pool) Retain(keep map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, conn := range p.conns {
		if !keep[addr] {
			// Closing a connection nobody uses any more cannot fail in a way we could act on.
			_ = conn.Close()
			delete(p.conns, addr)
		}
	}
}

// Len is the number of open connections.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close closes every connection.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for addr, conn := range p.conns {
		if err := conn.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close rep %s: %w", addr, err))
		}
		delete(p.conns, addr)
	}
	return errors.Join(errs...)
}
