package bulk

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const (
	started = nsyncv1.AppState_APP_STATE_STARTED
	stopped = nsyncv1.AppState_APP_STATE_STOPPED
	deleted = nsyncv1.AppState_APP_STATE_DELETED
)

// rec is an app record of guid at version with n instances.
func rec(guid string, version int64, n int32, state nsyncv1.AppState) *nsyncv1.AppRecord {
	return &nsyncv1.AppRecord{
		App:                 &nsyncv1.App{Guid: guid, Version: version, Instances: n},
		State:               state,
		Rootfs:              "preloaded:cflinuxfs4",
		PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{"pool:default"}},
	}
}

// pending gives r a pending restart to version.
func pending(r *nsyncv1.AppRecord, version int64) *nsyncv1.AppRecord {
	r.PendingVersion, r.PendingRootfs = version, "docker:///busybox"
	r.PendingConstraint = &modelsv1.PlacementConstraint{Require: []string{"pool:gpu"}}
	return r
}

// draining gives r a draining version that drains until until.
func draining(r *nsyncv1.AppRecord, version int64, until time.Time) *nsyncv1.AppRecord {
	r.DrainingVersion, r.DrainUntilUnixMs = version, until.UnixMilli()
	return r
}

// lrp is the BBS's scheduling info of version of app guid with n instances and no routes.
func lrp(guid string, version int64, n int32) *modelsv1.DesiredLRPSchedulingInfo {
	return &modelsv1.DesiredLRPSchedulingInfo{
		ProcessGuid: build.ProcessGuid(guid, version),
		Domain:      build.AppsDomain,
		Instances:   n,
		Labels:      map[string]string{build.LabelApp: guid},
	}
}

// describe renders a change for comparison.
func describe(ch Change) string {
	switch ch := ch.(type) {
	case Desire:
		return fmt.Sprintf("desire %s v%d %s %v", ch.ProcessGuid, ch.Version, ch.Rootfs, ch.Constraint.GetRequire())
	case Update:
		return fmt.Sprintf("update %s instances=%d", ch.ProcessGuid, ch.Update.GetInstances())
	case FinishDrain:
		return fmt.Sprintf("finish drain %s", build.ProcessGuid(ch.AppGuid, ch.Version))
	case Remove:
		return "remove " + ch.ProcessGuid
	case AdvanceRestart:
		return fmt.Sprintf("advance restart %s", build.ProcessGuid(ch.AppGuid, ch.Version))
	case DeleteTombstone:
		return fmt.Sprintf("delete tombstone %s@%d", ch.AppGuid, ch.ModRevision)
	}
	return fmt.Sprintf("unknown %T", ch)
}

func TestMake(t *testing.T) {
	pg := build.ProcessGuid
	tests := []struct {
		name   string
		lrps   []*modelsv1.DesiredLRPSchedulingInfo
		apps   []*nsyncv1.AppRecord
		want   []string
		errors int
	}{
		{
			name: "in sync: nothing",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("web", 1, 2)},
			apps: []*nsyncv1.AppRecord{rec("web", 1, 2, started)},
		},
		{
			name: "a started app's missing LRP is desired with its recorded placement",
			apps: []*nsyncv1.AppRecord{rec("web", 1, 2, started)},
			want: []string{"desire " + pg("web", 1) + " v1 preloaded:cflinuxfs4 [pool:default]"},
		},
		{
			name: "a drifted instance count is corrected",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("web", 1, 5)},
			apps: []*nsyncv1.AppRecord{rec("web", 1, 2, started)},
			want: []string{"update " + pg("web", 1) + " instances=2"},
		},
		{
			name: "drifted routes are corrected",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{func() *modelsv1.DesiredLRPSchedulingInfo {
				si := lrp("web", 1, 2)
				si.Routes = map[string][]byte{build.CFRouter: []byte(`[{"port":8080}]`)}
				return si
			}()},
			apps: []*nsyncv1.AppRecord{rec("web", 1, 2, started)},
			want: []string{"update " + pg("web", 1) + " instances=2"},
		},
		{
			name: "a pending version is desired with its own placement and its restart moved along",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("web", 1, 2)},
			apps: []*nsyncv1.AppRecord{pending(rec("web", 1, 2, started), 2)},
			want: []string{
				"desire " + pg("web", 2) + " v2 docker:///busybox [pool:gpu]",
				"advance restart " + pg("web", 2),
			},
		},
		{
			name: "a stopped app's pending restart is not moved along and its LRP is removed",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("web", 1, 2)},
			apps: []*nsyncv1.AppRecord{pending(rec("web", 1, 2, stopped), 2)},
			want: []string{"remove " + pg("web", 1)},
		},
		{
			name: "unknown LRPs are removed, in process guid order",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("zeta", 1, 1), lrp("alpha", 3, 1), lrp("web", 1, 2)},
			apps: []*nsyncv1.AppRecord{rec("web", 1, 2, started)},
			want: []string{"remove " + pg("alpha", 3), "remove " + pg("zeta", 1)},
		},
		{
			name: "a draining version is kept until its drain time is over",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("web", 1, 2), lrp("web", 2, 2)},
			apps: []*nsyncv1.AppRecord{draining(rec("web", 2, 2, started), 1, now.Add(time.Second))},
		},
		{
			name: "a drain that is over is finished, not removed as unknown",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("web", 1, 2), lrp("web", 2, 2)},
			apps: []*nsyncv1.AppRecord{draining(rec("web", 2, 2, started), 1, now)},
			want: []string{"finish drain " + pg("web", 1)},
		},
		{
			name: "a tombstone whose LRPs are listed waits for their removal",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("web", 1, 2)},
			apps: []*nsyncv1.AppRecord{rec("web", 1, 2, deleted)},
			want: []string{"remove " + pg("web", 1)},
		},
		{
			name: "a tombstone without listed LRPs is deleted at its revision",
			apps: []*nsyncv1.AppRecord{rec("web", 1, 2, deleted)},
			want: []string{"delete tombstone web@7"},
		},
		{
			name: "routes that do not encode are an error, and the rest is still planned",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("web", 1, 2), lrp("gone", 1, 1)},
			apps: []*nsyncv1.AppRecord{func() *nsyncv1.AppRecord {
				r := rec("web", 1, 2, started)
				r.App.Routes = structpb.NewNumberValue(math.NaN()) // JSON has no NaN
				return r
			}()},
			want:   []string{"remove " + pg("gone", 1)},
			errors: 1,
		},
		{
			name: "order: desires and updates, drains, removals, restarts, tombstones",
			lrps: []*modelsv1.DesiredLRPSchedulingInfo{lrp("old", 1, 1), lrp("api", 1, 1), lrp("api", 3, 1)},
			apps: []*nsyncv1.AppRecord{
				draining(pending(rec("api", 3, 4, started), 4), 1, now.Add(-time.Minute)),
				rec("web", 1, 2, started),
				rec("dead", 2, 1, deleted),
			},
			want: []string{
				"update " + pg("api", 3) + " instances=4",
				"desire " + pg("api", 4) + " v4 docker:///busybox [pool:gpu]",
				"desire " + pg("web", 1) + " v1 preloaded:cflinuxfs4 [pool:default]",
				"finish drain " + pg("api", 1),
				"remove " + pg("old", 1),
				"advance restart " + pg("api", 4),
				"delete tombstone dead@7",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Snapshot{LRPs: tt.lrps, Now: now}
			for _, r := range tt.apps {
				s.Apps = append(s.Apps, App{Record: r, ModRevision: 7})
			}
			p := Make(s)
			var got []string
			for _, ch := range p.Changes {
				got = append(got, describe(ch))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("changes:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			if len(p.Errors) != tt.errors {
				t.Errorf("errors %v, want %d", p.Errors, tt.errors)
			}
		})
	}
}

// TestMakeDesiresADeploymentsNewLRPWithItsPeer: a deployment's missing new LRP is desired with
// the old version as its spread peer (decision 0037); the old version, when missing, without.
func TestMakeDesiresADeploymentsNewLRPWithItsPeer(t *testing.T) {
	r := rec("web", 1, 3, started)
	r.Deployment = &nsyncv1.Deployment{FromVersion: 1, ToVersion: 2, NewDesired: 1, OldDesired: 3,
		State: nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING}
	p := Make(Snapshot{Apps: []App{{Record: r}}, Now: now})
	peers := map[string]*modelsv1.SpreadWith{}
	for _, ch := range p.Changes {
		if d, ok := ch.(Desire); ok {
			peers[d.ProcessGuid] = d.SpreadWith
		}
	}
	if len(peers) != 2 {
		t.Fatalf("desires %v, want both versions", p.Changes)
	}
	if sw := peers[build.ProcessGuid("web", 2)]; sw.GetProcessGuid() != build.ProcessGuid("web", 1) || sw.GetTotalInstances() != 3 {
		t.Errorf("the new LRP's peer %v, want web-v1 over 3", sw)
	}
	if sw := peers[build.ProcessGuid("web", 1)]; sw != nil {
		t.Errorf("the old LRP's peer %v, want none", sw)
	}
}

// TestMakeLeavesRecordsNewerThanTheListing: a record written after the LRPs were listed (the
// call that wrote it desires or updates its LRP itself) is neither desired nor corrected by the
// pass, and its LRPs are not removed; an older record with the same gap is.
func TestMakeLeavesRecordsNewerThanTheListing(t *testing.T) {
	s := Snapshot{
		LRPs: []*modelsv1.DesiredLRPSchedulingInfo{lrp("old", 1, 1), lrp("scaled", 1, 1)},
		Apps: []App{
			{Record: rec("new", 1, 2, started), ModRevision: 11},
			{Record: rec("scaled", 1, 3, started), ModRevision: 12},
			{Record: rec("gap", 1, 1, started), ModRevision: 9},
			{Record: rec("old", 1, 1, started), ModRevision: 5},
		},
		Now: now, ListedAt: 10,
	}
	var got []string
	for _, ch := range Make(s).Changes {
		got = append(got, describe(ch))
	}
	if want := []string{"desire gap-v1 v1 preloaded:cflinuxfs4 [pool:default]"}; !slices.Equal(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
}
