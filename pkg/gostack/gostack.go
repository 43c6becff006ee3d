// Package gostack grows a new goroutine's stack in one step, before it goes deep.
//
// A goroutine starts with a small stack (2 KiB, or the runtime's running average), and the
// runtime doubles it each time a call would overflow it: the whole stack is copied and every
// frame on it walked to adjust its pointers. A goroutine that commits one BBS batch item goes
// through the domain, the store and its cache before it waits, so it is grown three or four
// times, each time deeper. Grow, called first thing in such a goroutine, asks for the room
// once, while the stack holds a frame or two, so there is one copy and it is short.
//
// Only for short-lived goroutines, of which a bounded number run at once: a goroutine that
// lives on and waits shallow (an instance's lifecycle, a stream's handler) has its grown stack
// shrunk again by the garbage collector, which is another copy, and until then holds memory
// it does not use (docs/decisions/0065-goroutine-stacks-grown-early.md).
package gostack

import "sync/atomic"

// growBy is the frame Grow asks for. A stack that must hold it and the caller's few frames
// is doubled to 32 KiB, the depth of a BBS call's path down to its commit.
const growBy = 16 << 10

// Grow makes room on the calling goroutine's stack for about 16 KiB of further frames (a
// stack of 32 KiB in all) in one growth, which is cheap while the goroutine is shallow. Call
// it first in a goroutine that is about to go deep; elsewhere it only costs a function call.
func Grow() { grow() }

// grow has a frame of growBy bytes, which the runtime must fit on the stack on entry. The
// array is declared in a branch never taken, so its frame is reserved and never written: a
// frame is sized by every variable of the function, but a variable is zeroed only where it is
// declared (zeroing 16 KiB on every call cost more than the copies it saved).
//
//go:noinline
func grow() {
	if never.Load() {
		var buf [growBy]byte
		keep(buf[:])
	}
}

// never is false; grow's branch depends on it so that the compiler keeps the branch's frame.
var never atomic.Bool

// keep is a call the compiler cannot see through, so that grow's frame is not optimised away.
//
//go:noinline
func keep(b []byte) {
	if len(b) != growBy {
		panic("gostack: frame of the wrong size")
	}
}
