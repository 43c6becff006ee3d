package scale

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// The targets a run is checked against (docs/performance.md's goals, for 5,000 cells and
// 250,000 instances as deployed). They are printed beside what the run measured, never
// asserted: TestScaleQuick and TestScaleDeployedQuick fail on correctness only.
const (
	goalBurstRate  = 4000.0                 // burst placements/s, desire → RUNNING (C1M: 3,750/s)
	goalStreamRate = 2000.0                 // the sustained rate at which per-instance p99 is judged
	goalStreamP99  = 2 * time.Second        // per instance, desire → RUNNING, while sustaining it
	goalList       = time.Second            // a list of every actual LRP
	goalRouteP99   = 100 * time.Millisecond // event → route table, while placing
	goalSmallLoss  = 2 * time.Second        // 1% of the cells lost: the slowest instance
	goalLoss       = 5 * time.Second        // 10% of the cells lost: the slowest instance
	goalBBSRSS     = uint64(2 << 30)        // the BBS's peak RSS, as deployed
	goalKeepsUp    = 0.95                   // sustained ÷ offered that counts as keeping up
	busyBound      = 0.90                   // a machine this busy while placing is CPU-bound
)

// goal is one target of the report: what the run measured, whether that met it, and for one
// it missed, what bounds it and by how much.
type goal struct {
	target, measured string
	met              bool
	bound            string
}

// goals checks r against the targets. A rate or latency missed while the machine was busy is
// bound by CPU, and the bound says how many cores the target needs at this run's CPU per
// placement, split into the cells' share and the control plane's.
func (r *report) goals() []goal {
	cpu := r.cpuBound()
	var gs []goal
	add := func(target, measured string, met bool, bound string) {
		if met {
			bound = ""
		}
		gs = append(gs, goal{target: target, measured: measured, met: met, bound: bound})
	}
	add(fmt.Sprintf("burst ≥ %.0f placements/s", goalBurstRate), fmt.Sprintf("%.0f/s", r.burstRate),
		r.burstRate >= goalBurstRate, cpu.need(goalBurstRate))
	keepsUp := r.offered > 0 && r.streamRate >= goalKeepsUp*r.offered
	add(fmt.Sprintf("stream keeps up, p99 < %s at %.0f/s", goalStreamP99, goalStreamRate),
		fmt.Sprintf("%.0f/s of %.0f/s offered, p99 %s", r.streamRate, r.offered, ms(r.streamP99)),
		keepsUp && r.streamP99 < goalStreamP99 && r.offered >= goalKeepsUp*goalStreamRate, cpu.need(goalStreamRate))
	listBound := fmt.Sprintf("the BBS and the wire %s (the list taken undecoded), the client's decoding %s",
		ms(r.listRawMedian), ms(max(r.listMedian-r.listRawMedian, 0)))
	if len(r.idle) > 0 {
		listBound += fmt.Sprintf(", on a machine the cells at rest keep %.0f%% busy", 100*busy(r.idle, r.idleWall, cpu.cores))
	}
	add(fmt.Sprintf("list of %d actual LRPs < %s", r.listN, goalList), "median "+ms(r.listMedian),
		r.listMedian < goalList, listBound)
	add(fmt.Sprintf("event → route table p99 < %s", ms(goalRouteP99)), "p99 "+ms(r.routeP99),
		r.routeP99 < goalRouteP99, cpu.busyLine())
	if r.smallLoss.cells > 0 {
		add(fmt.Sprintf("%s of the cells lost: slowest < %s", share(r.smallLoss.cells, r.cfg.Cells), goalSmallLoss),
			"max "+ms(r.smallLoss.max), r.smallLoss.max < goalSmallLoss, r.smallLoss.rateBound(r.burstRate, goalSmallLoss))
	}
	add(fmt.Sprintf("%s of the cells lost: slowest < %s", share(r.loss.cells, r.cfg.Cells), goalLoss),
		"max "+ms(r.loss.max), r.loss.max < goalLoss, r.loss.rateBound(r.burstRate, goalLoss))
	add("presence: 0 healthy cells lost", fmt.Sprintf("%d lost", len(r.healthyLost)), len(r.healthyLost) == 0,
		"a defect: see the correct: line")
	for _, u := range r.usage {
		if u.name == "bbs" {
			add(fmt.Sprintf("BBS peak RSS < %d MiB", goalBBSRSS>>20), fmt.Sprintf("%.0f MiB", float64(u.peakRSS)/(1<<20)),
				u.peakRSS < goalBBSRSS, fmt.Sprintf("memory: the BBS's heap between collections, GOMEMLIMIT %q (its heap profile, DIR/bbs.heap with -profile-dir, holds what is live at exit)", r.cfg.BBSMemoryLimit))
		}
	}
	add("0 stranded, 0 running twice, 0 never routed",
		fmt.Sprintf("%d stranded, %d twice, %d never routed", r.stranded, r.duplicates, r.routeMissing),
		r.stranded == 0 && r.duplicates == 0 && r.routeMissing == 0, "a defect: see the correct: line")
	return gs
}

// rateBound is what bounds a loss phase's slowest instance: placing its instances within goal
// needs a rate, which this run's burst placed at.
func (l lossResult) rateBound(burstRate float64, goal time.Duration) string {
	if l.slots == 0 {
		return ""
	}
	return fmt.Sprintf("placement rate: its %d instances within %s need %.0f/s; this run's burst placed %.0f/s (see the burst's bound)",
		l.slots, goal, l.neededRate(goal), burstRate)
}

// neededRate is the placement rate that re-places every lost instance within goal.
func (l lossResult) neededRate(goal time.Duration) float64 {
	return float64(l.slots) / goal.Seconds()
}

// cpuShare is the CPU a placement took, by process, while the burst and the stream placed.
type cpuShare struct {
	busy    float64 // the machine's share used, 0–1
	cores   int
	cells   time.Duration            // the sim hosts' CPU per placement (as deployed)
	control time.Duration            // the services' (etcd, BBS, auctioneer, route-emitter, router)
	client  time.Duration            // the harness's: the load, the observer (in process: everything)
	each    map[string]time.Duration // per process, per placement
}

// cpuBound is this run's CPU per placement.
func (r *report) cpuBound() cpuShare {
	c := cpuShare{cores: r.cores, each: map[string]time.Duration{}}
	placed := r.burstN + r.streamN
	if placed == 0 || r.placingWall <= 0 {
		return c
	}
	c.busy = busy(r.placing, r.placingWall, c.cores)
	for _, u := range r.placing {
		per := u.cpu / time.Duration(placed)
		c.each[u.name] = per
		switch {
		case u.name == harnessProc || u.name == oneProcess:
			c.client += per
		case u.cells > 0:
			c.cells += per
		default:
			c.control += per
		}
	}
	return c
}

// busyLine says how busy the machine was while placing: a latency missed on a machine at
// least busyBound busy waited for the CPU.
func (c cpuShare) busyLine() string {
	if c.busy >= busyBound {
		return fmt.Sprintf("CPU: the machine was %.0f%% busy while placing", 100*c.busy)
	}
	return fmt.Sprintf("not CPU alone: the machine was %.0f%% busy while placing; see the run's profiles (-profile-dir)", 100*c.busy)
}

// need says what a placement rate needs of the CPU at this run's cost per placement.
func (c cpuShare) need(rate float64) string {
	total := c.cells + c.control + c.client
	if total == 0 {
		return c.busyLine()
	}
	cores := func(d time.Duration) float64 { return d.Seconds() * rate }
	s := c.busyLine() + fmt.Sprintf("; a placement took %s of CPU", msPrecise(total))
	if c.cells > 0 || c.control > 0 {
		names := make([]string, 0, len(c.each))
		for n := range c.each {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool { return c.each[names[i]] > c.each[names[j]] })
		parts := make([]string, 0, len(names))
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s %s", n, msPrecise(c.each[n])))
		}
		s += fmt.Sprintf(" (%s), so %.0f/s needs %.1f cores: the cells %.1f, the control plane %.1f, the load and observer %.1f; this machine has %d",
			strings.Join(parts, ", "), rate, cores(total), cores(c.cells), cores(c.control), cores(c.client), c.cores)
	} else {
		s += fmt.Sprintf(", so %.0f/s needs %.1f cores; this machine has %d", rate, cores(total), c.cores)
	}
	return s
}

// busy is the share (0–1) of a machine of cores that the processes of us used over wall.
func busy(us []procUsage, wall time.Duration, cores int) float64 {
	var used time.Duration
	for _, u := range us {
		used += u.cpu
	}
	return used.Seconds() / (float64(cores) * wall.Seconds())
}

// msPrecise formats d in milliseconds to two decimals (a placement's CPU is a fraction of one).
func msPrecise(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/1e6) }

// printGoals writes the goals block of the report.
func (r *report) printGoals(b *strings.Builder) {
	fmt.Fprintf(b, "  goals:    the targets for 5,000 cells and 250,000 instances as deployed, against this run's %d cells and %d instances\n",
		r.cfg.Cells, r.burstN+r.streamN)
	for _, g := range r.goals() {
		mark := "met"
		if !g.met {
			mark = "MISSED"
		}
		fmt.Fprintf(b, "    %-6s %s: %s\n", mark, g.target, g.measured)
		if !g.met && g.bound != "" {
			fmt.Fprintf(b, "           bound: %s\n", g.bound)
		}
	}
}

// TestGoals checks the goals block on a report with known figures: the targets missed and
// met, and the CPU bound's arithmetic (cores needed = CPU per placement × the target rate).
func TestGoals(t *testing.T) {
	r := &report{
		cfg: runConfig{Cells: 5000, Deployed: true}, cores: 2,
		burstN: 125000, streamN: 125000, burstRate: 600, offered: 1990, streamRate: 1950, streamP99: 1500 * time.Millisecond,
		listN: 250000, listMedian: 1100 * time.Millisecond, listRawMedian: 700 * time.Millisecond, routeP99: 80 * time.Millisecond,
		smallLoss: lossResult{cells: 50, slots: 2500, max: 4 * time.Second}, loss: lossResult{cells: 500, slots: 25000, max: 4 * time.Second},
		placingWall: 500 * time.Second,
		placing: []procUsage{
			{name: "sim hosts (rep)", n: 51, cells: 5000, cpu: 550 * time.Second},
			{name: "bbs", n: 1, cpu: 200 * time.Second},
			{name: "gavel-etcd", n: 1, cpu: 100 * time.Second},
			{name: "auctioneer", n: 1, cpu: 100 * time.Second},
			{name: "harness", n: 1, cpu: 50 * time.Second},
		},
		usage: []procUsage{{name: "bbs", n: 1, peakRSS: 2100 << 20}},
	}
	got := map[string]goal{}
	for _, g := range r.goals() {
		got[strings.Fields(g.target)[0]] = g
	}
	want := map[string]bool{"burst": false, "stream": true, "list": false, "event": true, "1%": false, "10%": true,
		"presence:": true, "BBS": false, "0": true}
	for name, met := range want {
		g, ok := got[name]
		if !ok {
			t.Fatalf("no goal starting %q in %v", name, got)
		}
		if g.met != met {
			t.Errorf("%s: met %v, want %v (%s)", g.target, g.met, met, g.measured)
		}
		if g.met != (g.bound == "") {
			t.Errorf("%s: met %v with bound %q: a missed goal names its bound, a met one none", g.target, g.met, g.bound)
		}
	}
	// 1,000 s of CPU for 250,000 placements on a machine of 2 cores over 500 s: 100% busy,
	// 4 ms a placement (the cells 2.2, the control plane 1.6, the harness 0.2), so 4,000/s
	// needs 16 cores.
	for _, s := range []string{"100% busy", "a placement took 4.00ms of CPU", "sim hosts (rep) 2.20ms, bbs 0.80ms",
		"4000/s needs 16.0 cores: the cells 8.8, the control plane 6.4, the load and observer 0.8; this machine has 2"} {
		if !strings.Contains(got["burst"].bound, s) {
			t.Errorf("burst's bound %q lacks %q", got["burst"].bound, s)
		}
	}
	if s := "its 2500 instances within 2s need 1250/s; this run's burst placed 600/s"; !strings.Contains(got["1%"].bound, s) {
		t.Errorf("1%% loss's bound %q lacks %q", got["1%"].bound, s)
	}
	if s := "the client's decoding 400.0ms"; !strings.Contains(got["list"].bound, s) {
		t.Errorf("list's bound %q lacks %q", got["list"].bound, s)
	}

	// A stream that fell behind what was offered misses even with a low p99.
	r.streamRate = 1500
	for _, g := range r.goals() {
		if strings.HasPrefix(g.target, "stream") && g.met {
			t.Errorf("stream at %.0f/s of %.0f/s offered met its goal", r.streamRate, r.offered)
		}
	}
	var b strings.Builder
	r.printGoals(&b)
	t.Log("\n" + b.String())
	if !strings.Contains(b.String(), "MISSED burst") || !strings.Contains(b.String(), "met    presence") {
		t.Errorf("goals block:\n%s", b.String())
	}
}
