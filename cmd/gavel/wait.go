package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// waitPoll is how often --wait reads the instances.
const waitPoll = 250 * time.Millisecond

// waitLRP waits until every desired instance of guid is RUNNING and no extra index remains.
// It shows a progress line (rewritten in place on a terminal, one line per change otherwise)
// and prints each placement error and crash as it appears. A CELL_MISMATCH or
// INSUFFICIENT_RESOURCES placement error ends the wait with its own exit code: the instance
// stays desired and convergence keeps retrying, but no cell can take it as things stand.
func (c *cli) waitLRP(ctx context.Context, guid string, timeout time.Duration) error {
	bbs, err := c.bbsClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	live := false
	if f, ok := c.err.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		live = true
	}
	w := &lrpWaiter{seen: map[string]bool{}}
	last := ""
	show := func(line string, final bool) {
		switch {
		case live:
			fmt.Fprintf(c.err, "\r\x1b[K%s", line)
			if final {
				fmt.Fprintln(c.err)
			}
		case line != last:
			fmt.Fprintln(c.err, line)
		}
		last = line
	}
	found := false
	for {
		d, err := bbs.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: guid})
		if status.Code(err) == codes.NotFound && !found {
			// With several BBS instances, the one answering may not have seen the desire yet
			// (each serves reads from its own cache): not found until first seen is a lag.
			err = nil
		} else if err == nil {
			found = true
			var a *bbsv1.ActualLRPsResponse
			a, err = bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{guid}}})
			if err == nil {
				p := w.observe(d.GetDesiredLrp().GetInstances(), a.GetActualLrps())
				if len(p.news) > 0 && live && last != "" {
					fmt.Fprint(c.err, "\r\x1b[K")
				}
				for _, n := range p.news {
					fmt.Fprintln(c.err, n)
				}
				if p.done {
					show(p.line, true)
					return nil
				}
				show(p.line, false)
				if p.mismatch != nil {
					if live {
						fmt.Fprintln(c.err)
					}
					return withExit(exitCellMismatch, fmt.Errorf("%s: cannot be placed: CELL_MISMATCH: %s", guid, p.mismatch.GetMessage()))
				}
				if p.insufficient != nil {
					if live {
						fmt.Fprintln(c.err)
					}
					return withExit(exitInsufficientResources, fmt.Errorf("%s: cannot be placed: INSUFFICIENT_RESOURCES: %s", guid, p.insufficient.GetMessage()))
				}
			}
		}
		if err != nil && ctx.Err() == nil {
			return err
		}
		select {
		case <-ctx.Done():
			if live && last != "" {
				fmt.Fprintln(c.err)
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return withExit(exitWaitTimeout, fmt.Errorf("%s: not every instance RUNNING after %s (%s)", guid, timeout, last))
			}
			return ctx.Err()
		case <-time.After(waitPoll):
		}
	}
}

// lrpWaiter remembers which placement errors and crashes were already printed.
type lrpWaiter struct {
	seen map[string]bool
}

// progress is one observation of an LRP's instances.
type progress struct {
	line         string
	done         bool
	news         []string
	mismatch     *modelsv1.PlacementError
	insufficient *modelsv1.PlacementError
}

// observe summarises the instances of an LRP with n desired instances.
func (w *lrpWaiter) observe(n int32, actuals []*modelsv1.ActualLRP) progress {
	var p progress
	best := map[int32]*modelsv1.ActualLRP{}
	extra := 0
	for _, a := range actuals {
		idx := a.GetKey().GetIndex()
		if idx >= n {
			if a.GetPresence() != modelsv1.ActualLRP_PRESENCE_EVACUATING {
				extra++
			}
			continue
		}
		if b, ok := best[idx]; !ok || rank(a) > rank(b) {
			best[idx] = a
		}
		if pe := a.GetPlacementError(); pe != nil && pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED {
			key := fmt.Sprintf("pe/%d/%s/%s", idx, pe.GetCode(), pe.GetMessage())
			if !w.seen[key] {
				w.seen[key] = true
				p.news = append(p.news, fmt.Sprintf("index %d: %s: %s", idx, trimEnum(pe.GetCode().String(), "CODE_"), pe.GetMessage()))
			}
			switch pe.GetCode() {
			case modelsv1.PlacementError_CODE_CELL_MISMATCH:
				p.mismatch = pe
			case modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES:
				p.insufficient = pe
			}
		}
		if cc := a.GetCrashCount(); cc > 0 {
			key := fmt.Sprintf("crash/%d/%d", idx, cc)
			if !w.seen[key] {
				w.seen[key] = true
				p.news = append(p.news, fmt.Sprintf("index %d crashed (%d×): %s", idx, cc, a.GetCrashReason()))
			}
		}
	}
	counts := map[modelsv1.ActualLRP_State]int{}
	for _, a := range best {
		counts[a.GetState()]++
	}
	missing := int(n) - len(best)
	running := counts[modelsv1.ActualLRP_STATE_RUNNING]
	parts := []string{fmt.Sprintf("%d/%d RUNNING", running, n)}
	for _, s := range []modelsv1.ActualLRP_State{modelsv1.ActualLRP_STATE_CLAIMED, modelsv1.ActualLRP_STATE_UNCLAIMED, modelsv1.ActualLRP_STATE_CRASHED} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], trimEnum(s.String(), "STATE_")))
		}
	}
	if missing > 0 {
		parts = append(parts, fmt.Sprintf("%d missing", missing))
	}
	if extra > 0 {
		parts = append(parts, fmt.Sprintf("%d stopping", extra))
	}
	p.line = strings.Join(parts, " · ")
	p.done = running == int(n) && extra == 0
	if p.done {
		p.mismatch, p.insufficient = nil, nil
	}
	return p
}

// rank orders copies of one index for the progress line: an ordinary copy shows the index's
// state; among others, a RUNNING one wins.
func rank(a *modelsv1.ActualLRP) int {
	r := 0
	if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_ORDINARY {
		r += 10
	}
	if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING {
		r++
	}
	return r
}
