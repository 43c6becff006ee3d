// Package porttest hands tests host ports that no other test on the machine (in this process or
// another) and no listener on port 0 can take while the test runs: for servers a test must name
// before they bind (a process it starts, an etcd member it restarts at the same address).
// internal/testkit re-exports it for the tests of services.
package porttest

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// Bounds of the host ports PortBlock hands out: below the kernel's usual ephemeral range
// (32768 on), so that listeners on port 0 never land in a block.
const (
	portBlocksFirst = 20000
	portBlocksEnd   = 32000
)

// portLockFile is where PortBlock's reservations are held: one byte-range lock per block, on
// the bytes at the block's port numbers, so blocks of any size conflict exactly when they
// overlap.
var portLockFile = filepath.Join(os.TempDir(), "gavel-test-ports.lock")

// PortBlock reserves n consecutive host ports for the test, for code that must be told a port
// range rather than be handed a listener (the process backend gives its containers host
// ports). The block is private to the test across every test on the machine, in this process
// or another: it is held by an open-file-description lock on its byte range of a file in the
// temporary directory, released when the test ends. It returns the first and last port.
func PortBlock(t testing.TB, n int) (first, last int) {
	t.Helper()
	if n <= 0 || n > portBlocksEnd-portBlocksFirst {
		t.Fatalf("port block of %d ports", n)
	}
	f, err := os.OpenFile(portLockFile, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("port block lock file: %v", err)
	}
	blocks := (portBlocksEnd - portBlocksFirst) / n
	offset := rand.IntN(blocks)
	for i := range blocks {
		start := portBlocksFirst + ((offset+i)%blocks)*n
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(start), Len: int64(n)}
		if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
				continue // another test holds an overlapping block
			}
			_ = f.Close()
			t.Fatalf("port block lock: %v", err)
		}
		// Closing the file releases the lock.
		t.Cleanup(func() { _ = f.Close() })
		return start, start + n - 1
	}
	_ = f.Close()
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
