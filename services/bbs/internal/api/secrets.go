package api

import (
	"context"

	"github.com/gavel-sched/gavel/pkg/authz"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/services/bbs/internal/store"
)

// secrets is which secret env values one call's answer may carry (docs/decisions/0021): all of
// them (admin, or any caller over plaintext), those of one cell's work (a rep, whose cell must
// start the work), or none (every other role, and a context the authorizer never saw).
type secrets struct {
	all  bool
	cell string
}

// secretsFor reads the caller the authorizer attached to ctx.
func secretsFor(ctx context.Context) secrets {
	c, ok := authz.CallerFrom(ctx)
	switch {
	case !ok || !c.MaySeeSecrets():
		return secrets{}
	case c.Unenforced || c.Role.Kind != authz.Rep:
		return secrets{all: true}
	default:
		return secrets{cell: c.Role.Param}
	}
}

// task returns t as the caller may see it: a rep sees the secrets of tasks on its own cell.
func (sc secrets) task(t *modelsv1.Task) *modelsv1.Task {
	if sc.all || (sc.cell != "" && t.GetCellId() == sc.cell) {
		return t
	}
	return models.RedactSecrets(t)
}

// tasks redacts a list, copying the slice only when an element changes.
func (sc secrets) tasks(ts []*modelsv1.Task) []*modelsv1.Task {
	return redactEach(ts, sc.task)
}

// desiredLRPs redacts a list of desired LRPs; a rep sees the secrets of those with an instance
// on its own cell.
func (sc secrets) desiredLRPs(cache Cache, ds []*modelsv1.DesiredLRP) []*modelsv1.DesiredLRP {
	if sc.all {
		return ds
	}
	onCell := sc.guidsOnCell(cache, nil)
	return redactEach(ds, func(d *modelsv1.DesiredLRP) *modelsv1.DesiredLRP {
		if _, ok := onCell[d.GetProcessGuid()]; ok {
			return d
		}
		return models.RedactSecrets(d)
	})
}

// desiredLRP is desiredLRPs for one.
func (sc secrets) desiredLRP(cache Cache, d *modelsv1.DesiredLRP) *modelsv1.DesiredLRP {
	if sc.all || !models.HasSecret(d) {
		return d
	}
	if _, ok := sc.guidsOnCell(cache, map[string]struct{}{d.GetProcessGuid(): {}})[d.GetProcessGuid()]; ok {
		return d
	}
	return models.RedactSecrets(d)
}

// guidsOnCell returns the process guids (of guids, or all when nil) with an instance, running
// or evacuating, on the rep's cell; nil for a caller that is not a rep.
func (sc secrets) guidsOnCell(cache Cache, guids map[string]struct{}) map[string]struct{} {
	if sc.cell == "" {
		return nil
	}
	actual, _ := cache.ActualLRPs(store.ListFilter{CellID: sc.cell, Guids: guids})
	out := make(map[string]struct{}, len(actual))
	for _, a := range actual {
		out[a.GetKey().GetProcessGuid()] = struct{}{}
	}
	return out
}

// event redacts one event stream answer: a rep needs no env from events (it reads its work's
// run info by claim or fetch), so only an all-seeing caller gets the values there.
func (sc secrets) event(r *bbsv1.SubscribeToEventsResponse) *bbsv1.SubscribeToEventsResponse {
	if sc.all {
		return r
	}
	return models.RedactSecrets(r)
}

// redactEach maps f over list, allocating a new slice only once f changes an element, so that
// a list without secrets costs no copy.
func redactEach[T comparable](list []T, f func(T) T) []T {
	out := list
	for i, v := range list {
		r := f(v)
		if r == v {
			continue
		}
		if &out[0] == &list[0] {
			out = append([]T(nil), list...)
		}
		out[i] = r
	}
	return out
}
