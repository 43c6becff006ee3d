package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// Bounds of the host ports PortBlock hands out: below the kernel's usual ephemeral range
// (32768 on), so that listeners on port 0 never land in a block.
const (
	portBlocksFirst = 20000
	portBlocksEnd   = 32000
)

// PortBlock reserves n consecutive host ports for the test, for code that must be told a port
// range rather than be handed a listener (the process backend gives its containers host
// ports). The block is private to the test across every test process on the machine: it is
// held with an exclusive lock on a file in the temporary directory, released when the test
// ends. It returns the first and last port of the block.
func PortBlock(t testing.TB, n int) (first, last int) {
	t.Helper()
	if n <= 0 || n > portBlocksEnd-portBlocksFirst {
		t.Fatalf("port block of %d ports", n)
	}
	blocks := (portBlocksEnd - portBlocksFirst) / n
	offset := rand.IntN(blocks)
	for i := range blocks {
		start := portBlocksFirst + ((offset+i)%blocks)*n
		path := filepath.Join(os.TempDir(), fmt.Sprintf("gavel-test-ports-%d-%d.lock", start, n))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			t.Fatalf("port block lock: %v", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			_ = f.Close()
			continue
		}
		// Closing the file releases the lock.
		t.Cleanup(func() { _ = f.Close() })
		return start, start + n - 1
	}
	t.Fatalf("no free block of %d host ports in %d-%d", n, portBlocksFirst, portBlocksEnd-1)
	return 0, 0
}

// ReservedPort is a port of a one-port PortBlock: for a server the test cannot hand a listener
// to (a route port the router binds itself, a process started by the test), which binds it
// later. No other test using PortBlock gets it while the test runs, and no listener on port 0
// gets it either (it is outside the ephemeral range).
func ReservedPort(t testing.TB) int {
	t.Helper()
	port, _ := PortBlock(t, 1)
	return port
}

// ReservedAddr is 127.0.0.1 with a ReservedPort, for a server in another process that must be
// told its address before it starts.
func ReservedAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ReservedPort(t)))
}
