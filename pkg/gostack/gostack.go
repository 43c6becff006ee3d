// Package gostack grows a new goroutine's stack in one step, before it goes deep.
//
// A goroutine starts with a small stack (2 KiB, or the runtime's running average), and the
// runtime doubles it each time a call would overflow it: the whole stack is copied and every
// frame on it walked to adjust its pointers. A goroutine that serves one gRPC call or one
// batch item goes through a dozen interceptors, a handler, the domain and the store before it
// waits, so it is grown three or four times, each time deeper. Profiles of the scale run put
// these copies at 4–10% of the BBS's, the auctioneer's and the reps' CPU
// (docs/decisions/0065-goroutine-stacks-grown-early.md). Grow, called first thing in such a
// goroutine, asks for the room once, while the stack holds a frame or two, so there is only
// one copy and it is short.
package gostack

// growBy is the frame Grow asks for. A stack that must hold it and the caller's few frames
// is doubled to 32 KiB, the depth of a BBS call's path down to its commit.
const growBy = 16 << 10

// Grow makes room on the calling goroutine's stack for about 16 KiB of further frames (a
// stack of 32 KiB in all) in one growth, which is cheap while the goroutine is shallow. Call
// it first in a goroutine that is about to go deep; elsewhere it only costs a function call.
func Grow() { grow() }

// grow has a frame of growBy bytes, which the runtime must fit on the stack on entry.
//
//go:noinline
func grow() {
	var buf [growBy]byte
	keep(buf[:])
}

// keep is a call the compiler cannot see through, so that grow's frame is not optimised away.
//
//go:noinline
func keep(b []byte) {
	if len(b) != growBy {
		panic("gostack: frame of the wrong size")
	}
}
