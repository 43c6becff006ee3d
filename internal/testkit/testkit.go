// Package testkit holds the helpers every test in the repository shares: polling until a
// condition holds (Eventually), loopback listeners that are bound before anyone learns their
// address (Listen, ListenPacket, Addr), and a runner that starts a service in the background
// and stops and joins it when the test ends (Start).
package testkit

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"
)

// Eventually and EventuallyState evaluate their condition first after MinPoll, then at an
// interval that doubles up to MaxPoll: quick for in-process conditions, gentle on conditions
// that call other processes.
const (
	MinPoll = 10 * time.Millisecond
	MaxPoll = 100 * time.Millisecond
)

// Eventually polls fn until it returns true, and fails the test with msg
// when timeout passes first.
func Eventually(t testing.TB, timeout time.Duration, fn func() bool, msg string) {
	t.Helper()
	EventuallyState(t, timeout, func() (bool, string) { return fn(), "" }, msg)
}

// EventuallyState polls fn until it reports true, and fails the test with
// msg and the last state fn described when timeout passes first.
func EventuallyState(t testing.TB, timeout time.Duration, fn func() (ok bool, state string), msg string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := MinPoll
	for {
		ok, state := fn()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state != "" {
				t.Fatalf("%s: not within %s (last: %s)", msg, timeout, state)
			}
			t.Fatalf("%s: not within %s", msg, timeout)
		}
		time.Sleep(wait)
		wait = min(2*wait, MaxPoll)
	}
}

// Listen returns a TCP listener bound to a port the kernel picked on 127.0.0.1; it is closed
// when the test ends. Hand the listener itself to the server under test: an address learnt
// from a listener that was closed again can be taken by another test before it is bound.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on loopback: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// ListenPacket is Listen for UDP.
func ListenPacket(t testing.TB) net.PacketConn {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on loopback udp: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Port is the port of a listener's or packet connection's local address.
func Port(addr net.Addr) int {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.Port
	case *net.UDPAddr:
		return a.Port
	}
	_, p, err := net.SplitHostPort(addr.String())
	if err != nil {
		return 0
	}
	port, _ := strconv.Atoi(p)
	return port
}

// Runner is a service with the repository's lifecycle: Run serves until ctx ends, calling
// ready once it serves (lifecycle.Runner has this shape).
type Runner interface {
	Run(ctx context.Context, ready func()) error
}

// Timeouts of Start.
const (
	// ReadyTimeout bounds the wait for a started service to call ready.
	ReadyTimeout = 60 * time.Second
	// StopTimeout bounds the wait for a stopped service's Run to return.
	StopTimeout = 30 * time.Second
)

// Running is a service started by Start.
type Running struct {
	t      testing.TB
	name   string
	cancel context.CancelFunc
	done   chan error
	joined bool
	err    error
}

// Start runs r in the background and returns once it called ready; the test fails when Run
// returns first or ready does not come within ReadyTimeout. When the test ends the service is
// stopped and joined (Stop) unless the test stopped it; an error it returns then fails the
// test. Cleanups registered after Start run before that stop.
func Start(t testing.TB, name string, r Runner) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Running{t: t, name: name, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() { s.done <- r.Run(ctx, func() { close(ready) }) }()
	t.Cleanup(func() {
		if s.joined {
			return // stopped by the test, which saw the error
		}
		if err := s.Stop(); err != nil {
			t.Errorf("%s stopped with error: %v", name, err)
		}
	})
	select {
	case <-ready:
	case err := <-s.done:
		s.joined, s.err = true, err
		cancel()
		t.Fatalf("%s stopped before it was ready: %v", name, err)
	case <-time.After(ReadyTimeout):
		t.Fatalf("%s not ready within %s", name, ReadyTimeout)
	}
	return s
}

// Stop cancels the service's context and waits for Run to return, reporting its error. A
// second call returns the first call's answer. A service that does not return within
// StopTimeout fails the test.
func (s *Running) Stop() error {
	s.t.Helper()
	if s.joined {
		return s.err
	}
	s.cancel()
	select {
	case s.err = <-s.done:
		s.joined = true
	case <-time.After(StopTimeout):
		s.joined = true
		s.err = fmt.Errorf("%s did not stop within %s", s.name, StopTimeout)
	}
	return s.err
}
