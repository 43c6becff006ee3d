package porttest

import (
	"errors"
	"io"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPortBlocksArePrivate(t *testing.T) {
	first, last := PortBlock(t, 10)
	if last-first != 9 || first < portBlocksFirst || last >= portBlocksEnd {
		t.Fatalf("block %d-%d", first, last)
	}
	// It is held: a lock on its last port, through another open file, is refused.
	f, err := os.OpenFile(portLockFile, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(last), Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
		t.Fatalf("locking port %d of the held block: %v, want refused", last, err)
	}
	// No other reservation overlaps it, whatever its size: ports reserved one by one and
	// blocks of 3 land outside it, and so do each other.
	taken := map[int]bool{}
	for p := first; p <= last; p++ {
		taken[p] = true
	}
	for range 200 {
		p := ReservedPort(t)
		if taken[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		taken[p] = true
	}
	for range 50 {
		f, l := PortBlock(t, 3)
		for p := f; p <= l; p++ {
			if taken[p] {
				t.Fatalf("port %d of block %d-%d handed out twice", p, f, l)
			}
			taken[p] = true
		}
	}
}

func TestPortBlockIsReleasedAtCleanup(t *testing.T) {
	// The block's byte range can be locked again once the test that held it ended.
	var first, last int
	t.Run("inner", func(t *testing.T) { first, last = PortBlock(t, 5) })
	f, err := os.OpenFile(portLockFile, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(first), Len: int64(last - first + 1)}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatalf("the block %d-%d is still held after its test ended: %v", first, last, err)
	}
}
