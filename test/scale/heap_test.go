package scale

import (
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"
)

// heapOwners attribute live heap to the parts of the run. The harness runs every service in
// one process, so the heap is split by who allocated each object: the innermost frame of the
// allocating stack that belongs to one of these packages (a proto message decoded by the BBS's
// cache counts for the BBS; a buffer gRPC allocates with no service frame above it counts as
// "other").
var heapOwners = []struct{ name, prefix string }{
	{"bbs", "github.com/gavel-sched/gavel/services/bbs"},
	{"auctioneer", "github.com/gavel-sched/gavel/services/auctioneer"},
	{"rep (all cells)", "github.com/gavel-sched/gavel/services/rep"},
	{"route-emitter", "github.com/gavel-sched/gavel/services/routeemitter"},
	{"router", "github.com/gavel-sched/gavel/services/router"},
	{"etcd server", "go.etcd.io/etcd/server"},
	{"etcd server", "go.etcd.io/raft"},
	{"etcd server", "go.etcd.io/bbolt"},
	{"harness", "github.com/gavel-sched/gavel/test/scale"},
}

// heapShare is one owner's live heap.
type heapShare struct {
	Owner string
	Bytes uint64
}

// heapByOwner runs a garbage collection and splits the live heap it leaves among heapOwners
// (and "other"), largest first. The runtime samples allocations (one per MemProfileRate bytes
// on average); each record is scaled back up as pprof does, so the shares are estimates whose
// sum is close to the live heap.
func heapByOwner() []heapShare {
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, false)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, false); ok {
			recs = recs[:n]
			break
		}
	}
	rate := float64(runtime.MemProfileRate)
	totals := map[string]float64{}
	for _, r := range recs {
		objs, bytes := r.InUseObjects(), r.InUseBytes()
		if objs <= 0 || bytes <= 0 {
			continue
		}
		scaled := float64(bytes)
		if rate > 1 {
			avg := float64(bytes) / float64(objs)
			scaled /= 1 - math.Exp(-avg/rate)
		}
		totals[ownerOf(r.Stack())] += scaled
	}
	out := make([]heapShare, 0, len(totals))
	for o, b := range totals {
		out = append(out, heapShare{Owner: o, Bytes: uint64(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Bytes > out[j].Bytes })
	return out
}

// ownerOf names the owner of the innermost frame of stack that belongs to one.
func ownerOf(stack []uintptr) string {
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		for _, o := range heapOwners {
			if strings.HasPrefix(f.Function, o.prefix) {
				return o.name
			}
		}
		if !more {
			return "other"
		}
	}
}

// formatShares prints shares as "bbs 812 MiB, rep (all cells) 640 MiB, …".
func formatShares(shares []heapShare) string {
	parts := make([]string, len(shares))
	for i, s := range shares {
		parts[i] = fmt.Sprintf("%s %.0f MiB", s.Owner, float64(s.Bytes)/(1<<20))
	}
	return strings.Join(parts, ", ")
}
