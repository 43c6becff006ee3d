// Package bulk is the pure planner of nsync's bulk loop: from a snapshot of nsync's app records
// and the LRPs the BBS holds in the cf-apps domain, Make decides which LRPs to desire, correct
// or remove, which restarts and drains to move along and which tombstones to drop. It reads no
// store and calls no service; the core applies the plan (services/nsync/internal/core/bulk.go),
// as the BBS's convergence applies its plan.
package bulk

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
)

// App is one app record with the revision it was read at.
type App struct {
	// Record is the app as nsync recorded it.
	Record *nsyncv1.AppRecord
	// ModRevision is the record's etcd mod revision (a tombstone is deleted only unchanged).
	ModRevision int64
}

// Snapshot is what a bulk pass judges. The BBS's LRPs are listed before the records: every LRP
// nsync desires is recorded first, so an LRP listed whose record is missing is truly unknown.
type Snapshot struct {
	// LRPs are the scheduling infos the BBS holds in the cf-apps domain.
	LRPs []*modelsv1.DesiredLRPSchedulingInfo
	// Apps are nsync's app records.
	Apps []App
	// Now is the time the pass judges drain deadlines against.
	Now time.Time
	// ListedAt is the revision of nsync's store read before the LRPs were listed (0: unknown).
	// A record changed after it (ModRevision > ListedAt) may have been desired or updated at the
	// BBS after the listing, by the call that changed it: the pass leaves its desires and
	// updates to that call and plans them again next time, so it never races the call (a
	// second DesireLRP would start the instances outside the call's trace).
	ListedAt int64
}

// Change is one step of a bulk plan.
type Change interface{ isChange() }

// Desire desires a live version of an app the BBS does not hold.
type Desire struct {
	// ProcessGuid is the LRP's process guid.
	ProcessGuid string
	// App is the version's definition with the app's routes and the version's instances.
	App *nsyncv1.App
	// Version is the app version to desire (the current, the pending one, or one of a
	// deployment's).
	Version int64
	// Rootfs and Constraint are the recorded placement of that version.
	Rootfs     string
	Constraint *modelsv1.PlacementConstraint
	// SpreadWith is the version's spread peer (build.SpreadWith): set for a deployment's new
	// LRP, nil otherwise.
	SpreadWith *modelsv1.SpreadWith
}

// Update corrects an LRP whose instances or routes drifted from its app.
type Update struct {
	// ProcessGuid is the LRP's process guid.
	ProcessGuid string
	// Update brings it to the app's instances and routes.
	Update *modelsv1.DesiredLRPUpdate
}

// FinishDrain removes a draining version whose drain time is over and clears it from the
// record.
type FinishDrain struct {
	// AppGuid and Version name the draining version.
	AppGuid string
	Version int64
}

// Remove removes an LRP of the cf-apps domain that no record expects.
type Remove struct {
	// ProcessGuid is the LRP's process guid.
	ProcessGuid string
}

// AdvanceRestart moves the pending restart of a started app along.
type AdvanceRestart struct {
	// AppGuid and Version name the pending version.
	AppGuid string
	Version int64
}

// DeleteTombstone deletes the record of a deleted app none of whose LRPs was listed.
type DeleteTombstone struct {
	// AppGuid is the deleted app.
	AppGuid string
	// ModRevision is the record's revision: the delete happens only if it is unchanged.
	ModRevision int64
}

func (Desire) isChange()          {}
func (Update) isChange()          {}
func (FinishDrain) isChange()     {}
func (Remove) isChange()          {}
func (AdvanceRestart) isChange()  {}
func (DeleteTombstone) isChange() {}

// Plan is what a bulk pass does, in order, and what it could not plan.
type Plan struct {
	// Changes are applied in order: desires and updates, finished drains, removals, restarts,
	// tombstones.
	Changes []Change
	// Errors are apps whose changes could not be planned (their routes do not encode); a pass
	// with errors is not complete.
	Errors []error
}

// Make plans a bulk pass over s: every live version of a started app is desired when missing
// and corrected when its instances or routes drifted; a draining version is kept until its
// drain time is over, then finished; every other LRP of the domain is removed; pending restarts
// of started apps are moved along; tombstones without listed LRPs are deleted.
func Make(s Snapshot) Plan {
	var p Plan
	atBBS := make(map[string]*modelsv1.DesiredLRPSchedulingInfo, len(s.LRPs))
	for _, si := range s.LRPs {
		atBBS[si.GetProcessGuid()] = si
	}
	expected := map[string]bool{}
	for _, a := range s.Apps {
		rec := a.Record
		app := rec.GetApp()
		newer := s.ListedAt > 0 && a.ModRevision > s.ListedAt
		for _, v := range build.LiveVersions(rec) {
			pg := build.ProcessGuid(app.GetGuid(), v)
			expected[pg] = true
			si, ok := atBBS[pg]
			if newer {
				continue
			}
			if !ok {
				def, w := build.VersionWork(rec, v)
				p.Changes = append(p.Changes, Desire{ProcessGuid: pg, App: def, Version: v, Rootfs: w.Rootfs, Constraint: w.Constraint,
					SpreadWith: build.SpreadWith(rec, v)})
				continue
			}
			u, err := build.LRPUpdateFor(rec, v)
			if err != nil {
				p.Errors = append(p.Errors, fmt.Errorf("update %s: %w", pg, err))
				continue
			}
			if si.GetInstances() == u.GetInstances() && sameRoutes(si.GetRoutes(), u.GetRoutes().GetRoutes()) {
				continue
			}
			p.Changes = append(p.Changes, Update{ProcessGuid: pg, Update: u})
		}
	}
	for _, a := range s.Apps {
		rec := a.Record
		d := rec.GetDrainingVersion()
		if d == 0 {
			continue
		}
		// Kept while draining; removed by FinishDrain once over.
		expected[build.ProcessGuid(rec.GetApp().GetGuid(), d)] = true
		if !s.Now.Before(time.UnixMilli(rec.GetDrainUntilUnixMs())) {
			p.Changes = append(p.Changes, FinishDrain{AppGuid: rec.GetApp().GetGuid(), Version: d})
		}
	}
	for _, pg := range slices.Sorted(maps.Keys(atBBS)) {
		if !expected[pg] {
			p.Changes = append(p.Changes, Remove{ProcessGuid: pg})
		}
	}
	for _, a := range s.Apps {
		if v := a.Record.GetPendingVersion(); v != 0 && a.Record.GetState() == nsyncv1.AppState_APP_STATE_STARTED {
			p.Changes = append(p.Changes, AdvanceRestart{AppGuid: a.Record.GetApp().GetGuid(), Version: v})
		}
	}
	// Tombstones of deleted apps go once none of their LRPs was listed (those listed are
	// removed above; the next pass confirms they are gone).
	listedApps := map[string]bool{}
	for _, si := range s.LRPs {
		listedApps[si.GetLabels()[build.LabelApp]] = true
	}
	for _, a := range s.Apps {
		if a.Record.GetState() == nsyncv1.AppState_APP_STATE_DELETED && !listedApps[a.Record.GetApp().GetGuid()] {
			p.Changes = append(p.Changes, DeleteTombstone{AppGuid: a.Record.GetApp().GetGuid(), ModRevision: a.ModRevision})
		}
	}
	return p
}

func sameRoutes(a, b map[string][]byte) bool {
	return maps.EqualFunc(a, b, bytes.Equal)
}
