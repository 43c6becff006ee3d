// Package hostports hands out the cell's host ports to containers, for every backend that maps
// container ports to host ports (process, oci).
package hostports

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
)

// Allocator hands out host ports from a range. Released ports go to the back of the free list,
// so a port is not reused right after its container ended. It is safe for concurrent use.
type Allocator struct {
	start, end int
	isFree     func(port int) bool // whether the host lets us bind port

	mu   sync.Mutex
	free []int
}

// New is an Allocator of the ports start to end (inclusive); isFree says whether the host lets
// a port be bound (Free, or a test's own).
func New(start, end int, isFree func(int) bool) *Allocator {
	a := &Allocator{start: start, end: end, isFree: isFree}
	for p := start; p <= end; p++ {
		a.free = append(a.free, p)
	}
	return a
}

// Acquire takes n ports, skipping those something else on the host is using (they stay in
// the free list for later). It takes all n or none.
func (a *Allocator) Acquire(n int) ([]int, error) {
	if n == 0 {
		return nil, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	got := make([]int, 0, n)
	tries := len(a.free)
	for i := 0; i < tries && len(got) < n; i++ {
		p := a.free[0]
		a.free = a.free[1:]
		if a.isFree(p) {
			got = append(got, p)
		} else {
			a.free = append(a.free, p)
		}
	}
	if len(got) < n {
		a.free = append(a.free, got...)
		return nil, fmt.Errorf("allocate %d host ports: only %d free in %d-%d", n, len(got), a.start, a.end)
	}
	return got, nil
}

// Release returns ports to the free list.
func (a *Allocator) Release(ports []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.free = append(a.free, ports...)
}

// Reserve takes ports out of the free list (those of containers a restarted rep adopted);
// ports not in it are ignored.
func (a *Allocator) Reserve(ports []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.free = slices.DeleteFunc(a.free, func(p int) bool { return slices.Contains(ports, p) })
}

// Free reports whether TCP port can be bound on 127.0.0.1 and on 0.0.0.0.
func Free(port int) bool {
	for _, host := range []string{"127.0.0.1", "0.0.0.0"} {
		l, err := net.Listen("tcp4", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

// Uint32 is a view of a as ports of type uint32, the type of container and host ports in the
// API (the CNI networking's PortAllocator).
type Uint32 struct{ *Allocator }

// Acquire takes n ports (see Allocator.Acquire).
func (u Uint32) Acquire(n int) ([]uint32, error) {
	ports, err := u.Allocator.Acquire(n)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(ports))
	for i, p := range ports {
		out[i] = uint32(p)
	}
	return out, nil
}

// Release returns ports to the free list.
func (u Uint32) Release(ports []uint32) { u.Allocator.Release(ints(ports)) }

// Reserve takes ports out of the free list (see Allocator.Reserve).
func (u Uint32) Reserve(ports []uint32) { u.Allocator.Reserve(ints(ports)) }

// ints converts ports to int.
func ints(ports []uint32) []int {
	in := make([]int, len(ports))
	for i, p := range ports {
		in[i] = int(p)
	}
	return in
}
