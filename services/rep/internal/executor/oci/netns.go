package oci

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/gavel-sched/gavel/services/rep/internal/executor/checks"
)

// dialInNetns dials from inside the network namespace at nsPath: the socket is created on an
// OS thread moved into that namespace, and the thread is thrown away afterwards (its goroutine
// ends locked), so no other goroutine ever runs in the container's namespace.
func dialInNetns(nsPath string) checks.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			conn net.Conn
			err  error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
			ns, err := os.Open(nsPath)
			if err != nil {
				ch <- result{err: fmt.Errorf("open network namespace: %w", err)}
				return
			}
			defer ns.Close()
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- result{err: fmt.Errorf("enter network namespace %s: %w", nsPath, err)}
				return
			}
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			ch <- result{conn: conn, err: err}
		}()
		select {
		case r := <-ch:
			return r.conn, r.err
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.conn != nil {
					_ = r.conn.Close()
				}
			}()
			return nil, ctx.Err()
		}
	}
}
