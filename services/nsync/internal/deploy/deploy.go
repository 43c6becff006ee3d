// Package deploy is the pure state machine of nsync's deployments: from a deployment record
// and what the leader observed of its two LRPs at the BBS, Advance decides the next step —
// how many instances each version's LRP should have, whether the deployment pauses, succeeds
// or fails — without reading a store or calling a service. The core records the step (one
// compare-and-swap of the app record) and then applies it at the BBS
// (services/nsync/internal/core/deploy.go), so a new leader resumes from the record alone.
//
// A step never lets the serving capacity fall below the app's instances: an old instance is
// retired only once a new one has been RUNNING and ready (routable) for min_healthy_time, and
// the next new instances start only once the retired old ones are gone (the BBS stops them
// drain-first). Instances are counted, not named: the BBS retires an LRP's highest indexes
// when it is scaled down.
package deploy

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
)

// Defaults of DeploymentOptions.
const (
	// DefaultMaxInFlight is the rolling strategy's max_in_flight.
	DefaultMaxInFlight = 1
	// DefaultCanaries is the canary strategy's canaries.
	DefaultCanaries = 1
)

// Observed is what the leader saw of a deployment's LRPs at the BBS.
type Observed struct {
	// Total is the app's instance count (it may change during a deployment).
	Total int32
	// NewReady counts the new version's ordinary instances below new_desired that are RUNNING
	// and routable (ready).
	NewReady int32
	// NewCrashed counts the new version's instances below new_desired that crashed at least
	// once, and CrashReason is the latest reason.
	NewCrashed  int32
	CrashReason string
	// NewPlacement is a placement error of an unplaced new instance (nil: none).
	NewPlacement *modelsv1.PlacementError
	// OldLeft counts the old version's instances still present; OldBeyond those of them at or
	// above old_desired (retired, not gone yet).
	OldLeft, OldBeyond int32
}

// Outcome is how a step ended the deployment.
type Outcome int

const (
	// Continue: the deployment goes on (or stays paused).
	Continue Outcome = iota
	// Succeeded: every instance runs the new version and no old one is left.
	Succeeded
	// Failed: the deployment failed (see its message).
	Failed
	// Cancelled: the deployment was cancelled (or superseded).
	Cancelled
)

// Step is the result of Advance.
type Step struct {
	// Deployment is the deployment after the step (a copy).
	Deployment *nsyncv1.Deployment
	// Changed says whether the record must be written.
	Changed bool
	// Scaled says whether new_desired or old_desired changed (the BBS must be told).
	Scaled bool
	// Outcome says whether the deployment ended.
	Outcome Outcome
}

// Active reports whether d is under way (running or paused).
func Active(d *nsyncv1.Deployment) bool {
	s := d.GetState()
	return s == nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING || s == nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED
}

// WithDefaults fills in the options' defaults: rolling, max_in_flight 1, canaries 1 for a
// canary deployment, deadline the given default.
func WithDefaults(o *nsyncv1.DeploymentOptions, deadline time.Duration) *nsyncv1.DeploymentOptions {
	out := proto.Clone(o).(*nsyncv1.DeploymentOptions)
	if o == nil {
		out = &nsyncv1.DeploymentOptions{}
	}
	if out.Strategy == nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_UNSPECIFIED {
		out.Strategy = nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_ROLLING
	}
	if out.MaxInFlight == 0 {
		out.MaxInFlight = DefaultMaxInFlight
	}
	if out.Strategy == nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY && out.Canaries == 0 {
		out.Canaries = DefaultCanaries
	}
	if out.ProgressDeadlineMs == 0 {
		out.ProgressDeadlineMs = deadline.Milliseconds()
	}
	return out
}

// Start is a new deployment of app guid from version from (running total instances) to
// version to, with options o (defaults filled in).
func Start(id, guid string, from, to int64, total int32, o *nsyncv1.DeploymentOptions, now time.Time) *nsyncv1.Deployment {
	return &nsyncv1.Deployment{
		Id: id, AppGuid: guid, FromVersion: from, ToVersion: to, Options: o,
		State:         nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING,
		OldDesired:    total,
		CreatedUnixMs: now.UnixMilli(), ProgressUnixMs: now.UnixMilli(),
	}
}

// Revert is the deployment that takes failed (or cancelled) d back to its old version by the
// same steps: the old version's LRP is the new one, scaled up from where d left it, while d's
// new version is retired. A revert is rolling and never reverts itself.
func Revert(id string, d *nsyncv1.Deployment, now time.Time) *nsyncv1.Deployment {
	o := proto.Clone(d.GetOptions()).(*nsyncv1.DeploymentOptions)
	if o == nil {
		o = &nsyncv1.DeploymentOptions{}
	}
	o.Strategy, o.Canaries, o.NoAutoRevert = nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_ROLLING, 0, true
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	return &nsyncv1.Deployment{
		Id: id, AppGuid: d.GetAppGuid(), FromVersion: d.GetToVersion(), ToVersion: d.GetFromVersion(),
		Options: o, State: nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING, RevertOf: d.GetId(),
		NewDesired: d.GetOldDesired(), OldDesired: d.GetNewDesired(),
		CreatedUnixMs: now.UnixMilli(), ProgressUnixMs: now.UnixMilli(),
	}
}

// Advance decides the next step of d from what was observed at now. It is pure and
// idempotent: applied again to its own result with the same observation it changes nothing.
func Advance(in *nsyncv1.Deployment, o Observed, now time.Time) (st Step) {
	d := proto.Clone(in).(*nsyncv1.Deployment)
	st = Step{Deployment: d}
	if !Active(d) {
		return st
	}
	defer func() { st.Changed = st.Changed || !proto.Equal(in, d) }()
	d.OldLeft = o.OldLeft
	if pe := o.NewPlacement; pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED {
		d.PlacementError = proto.Clone(pe).(*modelsv1.PlacementError)
	}
	end := func(state nsyncv1.DeploymentState, out Outcome, msg string) Step {
		d.State, d.Message, d.FinishedUnixMs = state, msg, now.UnixMilli()
		st.Outcome = out
		return st
	}
	if d.GetCancelRequested() {
		msg := d.GetMessage()
		if msg == "" {
			msg = "cancelled"
		}
		return end(nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED, Cancelled, msg)
	}
	if d.GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED {
		return st
	}
	opts := d.GetOptions()
	// A fresh version's crash fails the deployment at once (a revert's version may carry old
	// crashes: it is judged by its deadline only).
	if o.NewCrashed > 0 && d.GetRevertOf() == "" {
		return end(nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED, Failed,
			fmt.Sprintf("%d new instance(s) of version %d crashed: %s", o.NewCrashed, d.GetToVersion(), o.CrashReason))
	}
	if o.NewPlacement.GetCode() == modelsv1.PlacementError_CODE_CELL_MISMATCH {
		return end(nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED, Failed,
			fmt.Sprintf("version %d cannot be placed: CELL_MISMATCH: %s", d.GetToVersion(), o.NewPlacement.GetMessage()))
	}
	// Readiness: the count of ready new instances must hold min_healthy_time to count.
	if o.NewReady != d.GetReadyObserved() {
		d.ReadyObserved, d.ReadySinceUnixMs = o.NewReady, now.UnixMilli()
	}
	if now.Sub(time.UnixMilli(d.GetReadySinceUnixMs())) >= time.Duration(opts.GetMinHealthyTimeMs())*time.Millisecond {
		if d.GetReadyObserved() > d.GetNewHealthy() {
			d.ProgressUnixMs = now.UnixMilli()
		}
		d.NewHealthy = d.GetReadyObserved()
	} else if d.GetReadyObserved() < d.GetNewHealthy() {
		d.NewHealthy = d.GetReadyObserved() // a healthy instance went away
	}
	if deadline := time.Duration(opts.GetProgressDeadlineMs()) * time.Millisecond; deadline > 0 && now.Sub(time.UnixMilli(d.GetProgressUnixMs())) > deadline {
		msg := fmt.Sprintf("no progress within %s: %d/%d new instances healthy", deadline, d.GetNewHealthy(), o.Total)
		if pe := d.GetPlacementError(); pe != nil {
			msg += fmt.Sprintf("; %s: %s", pe.GetCode(), pe.GetMessage())
		}
		return end(nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED, Failed, msg)
	}
	if o.OldBeyond > 0 {
		return st // retired old instances are still draining: the next step waits for them
	}
	n := max(o.Total, 0)
	scale := func(newDesired, oldDesired int32) {
		if newDesired != d.GetNewDesired() || oldDesired != d.GetOldDesired() {
			d.NewDesired, d.OldDesired, d.ProgressUnixMs = newDesired, oldDesired, now.UnixMilli()
			st.Scaled = true
		}
	}
	newDesired, oldDesired := min(d.GetNewDesired(), n), min(d.GetOldDesired(), n)
	switch {
	case opts.GetStrategy() == nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_RECREATE:
		if oldDesired > 0 {
			scale(newDesired, 0)
			return st
		}
		newDesired = n
	case opts.GetStrategy() == nsyncv1.DeploymentStrategy_DEPLOYMENT_STRATEGY_CANARY && !d.GetPromoted():
		c := min(max(opts.GetCanaries(), 1), n)
		scale(max(newDesired, c), oldDesired)
		if d.GetNewHealthy() >= c && !st.Scaled {
			d.State = nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED
			d.Message = fmt.Sprintf("%d canary instance(s) of version %d healthy: promote or cancel", c, d.GetToVersion())
		}
		return st
	default:
		// Retire as many old instances as new ones are healthy beyond the app's count, then
		// start up to max_in_flight more new instances than old ones were retired.
		oldDesired = min(oldDesired, max(n-d.GetNewHealthy(), 0))
		if oldDesired < d.GetOldDesired() {
			scale(newDesired, oldDesired)
			return st // the surge waits until the retired instances are gone
		}
		newDesired = max(newDesired, min(n, n-oldDesired+max(opts.GetMaxInFlight(), 1)))
	}
	scale(newDesired, oldDesired)
	if !st.Scaled && d.GetNewDesired() == n && d.GetNewHealthy() >= n && d.GetOldDesired() == 0 {
		return end(nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED, Succeeded,
			fmt.Sprintf("%d instance(s) of version %d healthy", n, d.GetToVersion()))
	}
	return st
}
