package process

import (
	"fmt"
	"net"
	"strconv"
	"sync"
)

// portAllocator hands out host ports from a range. Released ports go to the back of the
// free list, so a port is not reused right after its container ended.
type portAllocator struct {
	start, end int
	isFree     func(port int) bool // whether the host lets us bind port

	mu   sync.Mutex
	free []int
}

func newPortAllocator(start, end int, isFree func(int) bool) *portAllocator {
	a := &portAllocator{start: start, end: end, isFree: isFree}
	for p := start; p <= end; p++ {
		a.free = append(a.free, p)
	}
	return a
}

// acquire takes n ports, skipping those something else on the host is using (they stay in
// the free list for later). It takes all n or none.
func (a *portAllocator) acquire(n int) ([]int, error) {
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

// release returns ports to the free list.
func (a *portAllocator) release(ports []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.free = append(a.free, ports...)
}

// hostPortFree reports whether TCP port can be bound on 127.0.0.1 and on 0.0.0.0.
func hostPortFree(port int) bool {
	for _, host := range []string{"127.0.0.1", "0.0.0.0"} {
		l, err := net.Listen("tcp4", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}
