// Package metrics is the shared Prometheus plumbing of Gavel's services: a registry of the
// service's own (with the Go and process collectors) and an HTTP server that exposes it at
// /metrics.
package metrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gavel-sched/gavel/pkg/lifecycle"
)

// NewRegistry returns a registry holding the Go runtime and process collectors. Each service
// instance gets its own, so several can run in one process (tests, `gavel dev`).
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves reg in the Prometheus text format.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// Server serves a registry at /metrics over plain HTTP, or over mutual TLS (WithTLS).
type Server struct {
	address string
	reg     *prometheus.Registry
	tls     func() (*tls.Config, error)

	mu   sync.Mutex
	addr net.Addr
}

// Option configures a Server.
type Option func(*Server)

// WithTLS serves /metrics over TLS with the configuration load returns when the server starts
// (a server configuration requiring a client certificate makes it mutual TLS: a scraper then
// presents a certificate of the cluster's CA, as every gRPC client does).
func WithTLS(load func() (*tls.Config, error)) Option { return func(s *Server) { s.tls = load } }

// NewServer returns a server for reg on address (e.g. "127.0.0.1:9090"); Run starts it.
func NewServer(address string, reg *prometheus.Registry, opts ...Option) *Server {
	s := &Server{address: address, reg: reg}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Run listens, calls ready, and serves until ctx ends; it then shuts the server down.
func (s *Server) Run(ctx context.Context, ready func()) error {
	var tc *tls.Config
	if s.tls != nil {
		var err error
		if tc, err = s.tls(); err != nil {
			return fmt.Errorf("metrics tls: %w", err)
		}
	}
	ln, err := net.Listen("tcp", s.address)
	if err != nil {
		return fmt.Errorf("metrics listen %s: %w", s.address, err)
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	s.mu.Lock()
	s.addr = ln.Addr()
	s.mu.Unlock()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", Handler(s.reg))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ready()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("metrics server shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}

// Addr is the bound address once Run has called ready (nil before, and nil for a nil server:
// metrics off).
func (s *Server) Addr() net.Addr {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Members is the run-group member that serves s, or none for a nil server (metrics off), so a
// service starts its metrics first with append(s.metrics.Members(), ...).
func (s *Server) Members() []lifecycle.Member {
	if s == nil {
		return nil
	}
	return []lifecycle.Member{{Name: "metrics", Runner: s}}
}

// NewServerIf is NewServer, or nil (metrics off) when address is empty.
func NewServerIf(address string, reg *prometheus.Registry, opts ...Option) *Server {
	if address == "" {
		return nil
	}
	return NewServer(address, reg, opts...)
}
