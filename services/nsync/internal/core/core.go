// Package core is nsync's domain logic: apps become DesiredLRPs and tasks (through the
// transformer chain), placement pools become their placement constraints, restarts bring a new
// version up before the old one goes, and the bulk pass keeps the BBS in step with the records.
package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
	"github.com/gavel-sched/gavel/services/nsync/internal/store"
)

// Transformer augments the work nsync builds before it is sent to the BBS (the chain of
// pkg/transform). It may refuse an object with an error carrying a gRPC code.
type Transformer interface {
	// DesiredLRP returns the transformed LRP.
	DesiredLRP(ctx context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error)
	// Task returns the transformed task.
	Task(ctx context.Context, t *modelsv1.Task) (*modelsv1.Task, error)
}

// Identity is the Transformer of an nsync without plugins.
type Identity struct{}

// DesiredLRP implements Transformer.
func (Identity) DesiredLRP(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
	return d, nil
}

// Task implements Transformer.
func (Identity) Task(_ context.Context, t *modelsv1.Task) (*modelsv1.Task, error) { return t, nil }

// Observer is told what nsync did (the service's metrics).
type Observer interface {
	// BulkPass reports a finished bulk pass, its duration and whether it completed.
	BulkPass(d time.Duration, ok bool)
	// Reconciled counts LRPs the bulk pass desired again, updated and removed.
	Reconciled(desired, updated, removed int)
	// Restart reports how a restart ended: "completed", "cell_mismatch" or "timed_out".
	Restart(outcome string)
	// Deployment reports how a deployment ended: "succeeded", "failed" or "cancelled".
	Deployment(outcome string)
}

type nopObserver struct{}

func (nopObserver) BulkPass(time.Duration, bool) {}
func (nopObserver) Reconciled(int, int, int)     {}
func (nopObserver) Restart(string)               {}
func (nopObserver) Deployment(string)            {}

// Config is what Core needs besides its store and BBS.
type Config struct {
	// Stacks maps stack names to rootfs URIs.
	Stacks build.Stacks
	// Limits are the BBS's limits on work, checked before anything is stored.
	Limits models.Limits
	// Transformer runs on every LRP and task built; nil is Identity.
	Transformer Transformer
	// RestartTimeout bounds how long a restart waits for the new version to run before it is
	// abandoned (the old version keeps running).
	RestartTimeout time.Duration
	// RouteDrain is how long a restart's old version stays up without routes before it is
	// removed, so that routers have dropped it and its requests in flight finish.
	RouteDrain time.Duration
	// RestartPoll is how often a restart checks the new version's instances.
	RestartPoll time.Duration
	// DomainTTL is how long the cf-apps domain stays fresh after a complete bulk pass.
	DomainTTL time.Duration
	// ProgressDeadline is a deployment's default progress deadline.
	ProgressDeadline time.Duration
	// DeployPoll is how often the leader's loop steps every deployment.
	DeployPoll time.Duration
	// Logger receives the logs; nil discards them.
	Logger hclog.Logger
	// Observer is told about passes and restarts; nil ignores them.
	Observer Observer
	// Now reads the clock; nil is time.Now.
	Now func() time.Time
}

// Core implements nsync's API over its store and the BBS.
type Core struct {
	cfg   Config
	store *store.Store
	bbs   bbsv1.BBSServiceClient
	log   hclog.Logger
	// kick wakes the deployment loop when a deployment is recorded or changed.
	kick chan struct{}
	// leaderMu serializes the leader's bulk pass and deployment steps.
	leaderMu sync.Mutex
}

// New returns a Core.
func New(st *store.Store, bbs bbsv1.BBSServiceClient, cfg Config) *Core {
	if cfg.Transformer == nil {
		cfg.Transformer = Identity{}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RestartPoll <= 0 {
		cfg.RestartPoll = 200 * time.Millisecond
	}
	if cfg.DeployPoll <= 0 {
		cfg.DeployPoll = 250 * time.Millisecond
	}
	if cfg.ProgressDeadline <= 0 {
		cfg.ProgressDeadline = 5 * time.Minute
	}
	return &Core{cfg: cfg, store: st, bbs: bbs, log: cfg.Logger, kick: make(chan struct{}, 1)}
}

// lrp builds version of the recorded app with rootfs and constraint, runs the transformer
// chain over it and validates the result as the BBS would.
func (c *Core) lrp(ctx context.Context, app *nsyncv1.App, version int64, rootfs string, constraint *modelsv1.PlacementConstraint) (*modelsv1.DesiredLRP, error) {
	d, err := build.LRP(app, version, build.Work{Rootfs: rootfs, Constraint: constraint})
	if err != nil {
		return nil, err
	}
	d, err = c.cfg.Transformer.DesiredLRP(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("transform %s: %w", build.ProcessGuid(app.GetGuid(), version), err)
	}
	if err := models.ValidateDesiredLRP("desired_lrp", d, c.cfg.Limits); err != nil {
		return nil, err
	}
	return d, nil
}

// placement resolves the rootfs and the constraint of new work of app: its stack (or docker
// image) and its space's pool (or the default pool).
func (c *Core) placement(ctx context.Context, field string, app *nsyncv1.App) (string, *modelsv1.PlacementConstraint, error) {
	rootfs, err := c.cfg.Stacks.Rootfs(field, app)
	if err != nil {
		return "", nil, err
	}
	pools, err := c.store.AllPools(ctx)
	if err != nil {
		return "", nil, err
	}
	return rootfs, build.Constraint(pools.For(app.GetSpaceGuid())), nil
}

// DesireApp records a new app as version 1 and desires its LRP. Once the record is stored the
// app is accepted: when the BBS cannot be reached the bulk loop desires the LRP later.
func (c *Core) DesireApp(ctx context.Context, in *nsyncv1.App) (*nsyncv1.App, string, error) {
	if err := build.ValidateApp("app", in, c.cfg.Limits); err != nil {
		return nil, "", err
	}
	app := proto.Clone(in).(*nsyncv1.App)
	app.Version = 1
	rootfs, constraint, err := c.placement(ctx, "app", app)
	if err != nil {
		return nil, "", err
	}
	d, err := c.lrp(ctx, app, app.GetVersion(), rootfs, constraint)
	if err != nil {
		return nil, "", err
	}
	rec := &nsyncv1.AppRecord{App: app, State: nsyncv1.AppState_APP_STATE_STARTED, Rootfs: rootfs, PlacementConstraint: constraint}
	rec.Versions = []*nsyncv1.AppVersion{{Version: app.GetVersion(), App: app, Rootfs: rootfs, PlacementConstraint: constraint, CreatedUnixMs: c.cfg.Now().UnixMilli(), Healthy: true}}
	_, err = c.store.CreateApp(ctx, rec)
	if errors.Is(err, rpcerr.ErrAlreadyExists) {
		// A deleted app's record stays until its LRPs are gone: a new app of the same guid
		// takes it over past every version it had, so no old LRP is mistaken for the new one.
		deleted, gerr := c.store.GetApp(ctx, app.GetGuid())
		if gerr != nil {
			return nil, "", gerr
		}
		if deleted.Record.GetState() != nsyncv1.AppState_APP_STATE_DELETED {
			return nil, "", err
		}
		app.Version = lastVersion(deleted.Record) + 1
		rec.Versions[0].Version = app.GetVersion()
		if d, err = c.lrp(ctx, app, app.GetVersion(), rootfs, constraint); err != nil {
			return nil, "", err
		}
		_, err = c.store.PutApp(ctx, rec, deleted.ModRevision)
	}
	if err != nil {
		return nil, "", err
	}
	if err := c.desire(ctx, d); err != nil {
		if status.Code(err) == codes.InvalidArgument {
			// The BBS refused what nsync accepted: forget the app so nothing stays stored.
			if cur, gerr := c.store.GetApp(ctx, app.GetGuid()); gerr == nil {
				_ = c.store.DeleteApp(ctx, app.GetGuid(), cur.ModRevision)
			}
			return nil, "", err
		}
		c.log.Warn("desire at the BBS failed; the bulk loop retries", "app_guid", app.GetGuid(), "error", err)
	}
	return app, d.GetProcessGuid(), nil
}

// desire desires d at the BBS; an LRP that already exists counts as desired.
func (c *Core) desire(ctx context.Context, d *modelsv1.DesiredLRP) error {
	_, err := c.bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
	if status.Code(err) == codes.AlreadyExists {
		return nil
	}
	return err
}

// remove removes an LRP at the BBS; one that is already gone counts as removed.
func (c *Core) remove(ctx context.Context, processGuid string) error {
	_, err := c.bbs.RemoveDesiredLRP(ctx, &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: processGuid})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	return err
}

// lastVersion is the highest version a record knows of.
func lastVersion(rec *nsyncv1.AppRecord) int64 {
	v := max(rec.GetApp().GetVersion(), rec.GetPendingVersion(), rec.GetDrainingVersion(),
		rec.GetDeployment().GetToVersion(), rec.GetDeployment().GetFromVersion(), rec.GetQueued().GetToVersion())
	for _, av := range rec.GetVersions() {
		v = max(v, av.GetVersion())
	}
	return v
}

// getApp reads the app guid; a deleted app is NotFound.
func (c *Core) getApp(ctx context.Context, guid string) (store.App, error) {
	cur, err := c.store.GetApp(ctx, guid)
	if err == nil && cur.Record.GetState() == nsyncv1.AppState_APP_STATE_DELETED {
		return store.App{}, rpcerr.NotFound("app %q not found", guid)
	}
	return cur, err
}

// update changes the recorded app with f under compare-and-swap, retrying lost races.
func (c *Core) update(ctx context.Context, guid string, f func(rec *nsyncv1.AppRecord) error) (*nsyncv1.AppRecord, error) {
	for attempt := 0; ; attempt++ {
		cur, err := c.getApp(ctx, guid)
		if err != nil {
			return nil, err
		}
		rec := proto.Clone(cur.Record).(*nsyncv1.AppRecord)
		if err := f(rec); err != nil {
			return nil, err
		}
		_, err = c.store.PutApp(ctx, rec, cur.ModRevision)
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, rpcerr.ErrAborted) || attempt >= 5 {
			return nil, err
		}
	}
}

// UpdateApp changes an app's instances and routes, in the record and in place at the BBS.
func (c *Core) UpdateApp(ctx context.Context, req *nsyncv1.UpdateAppRequest) (*nsyncv1.App, error) {
	e := &rpcerr.InvalidError{}
	e.Merge("guid", models.ValidateGuid("guid", req.GetGuid()))
	if req.Instances != nil && (req.GetInstances() < 0 || req.GetInstances() > c.limits().MaxInstances) {
		e.Add("instances", "must be between 0 and %d, got %d", c.limits().MaxInstances, req.GetInstances())
	}
	e.Merge("routes", build.ValidateRoutes("routes", req.GetRoutes()))
	if err := e.Err(); err != nil {
		return nil, err
	}
	if req.Instances == nil && req.Routes == nil {
		return nil, rpcerr.Invalid("instances", "nothing to update: set instances or routes")
	}
	rec, err := c.update(ctx, req.GetGuid(), func(rec *nsyncv1.AppRecord) error {
		if req.Instances != nil {
			rec.App.Instances = req.GetInstances()
		}
		if req.Routes != nil {
			rec.App.Routes = req.GetRoutes()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.applyInPlace(ctx, rec)
	return rec.GetApp(), nil
}

func (c *Core) limits() models.Limits {
	l := c.cfg.Limits
	if l.MaxInstances <= 0 {
		l.MaxInstances = models.DefaultMaxInstances
	}
	return l
}

// StopApp marks the app stopped (or forgets it) and removes its LRPs from the BBS.
func (c *Core) StopApp(ctx context.Context, guid string, del bool) error {
	if err := models.ValidateGuid("guid", guid); err != nil {
		return err
	}
	cur, err := c.getApp(ctx, guid)
	if err != nil {
		return err
	}
	live := build.LiveVersions(cur.Record)
	if d := cur.Record.GetDrainingVersion(); d != 0 {
		live = append(live, d)
	}
	rec := proto.Clone(cur.Record).(*nsyncv1.AppRecord)
	rec.State = nsyncv1.AppState_APP_STATE_STOPPED
	if del {
		// Kept as a tombstone until its LRPs are gone (see DesireApp and the bulk pass).
		rec.State = nsyncv1.AppState_APP_STATE_DELETED
		rec.App.Version = lastVersion(cur.Record)
	}
	rec.PendingVersion, rec.PendingConstraint, rec.PendingRootfs, rec.PendingSinceUnixMs = 0, nil, "", 0
	rec.DrainingVersion, rec.DrainUntilUnixMs = 0, 0
	for _, d := range []*nsyncv1.Deployment{rec.GetQueued(), rec.GetDeployment()} {
		if d != nil {
			// A stop ends the app's deployments: its versions' LRPs go with the others.
			d.State, d.Message, d.FinishedUnixMs = nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED, "the app was stopped", c.cfg.Now().UnixMilli()
			rec.Deployments = trim(append([]*nsyncv1.Deployment{d}, rec.GetDeployments()...))
		}
	}
	rec.Deployment, rec.Queued = nil, nil
	modRev, err := c.store.PutApp(ctx, rec, cur.ModRevision)
	if err != nil {
		return err
	}
	removed := true
	for _, v := range live {
		if err := c.remove(ctx, build.ProcessGuid(guid, v)); err != nil {
			removed = false
			c.log.Warn("remove at the BBS failed; the bulk loop removes it", "app_guid", guid, "version", v, "error", err)
		}
	}
	if del && removed {
		if err := c.store.DeleteApp(ctx, guid, modRev); err != nil {
			c.log.Debug("tombstone left for the bulk loop", "app_guid", guid, "error", err)
		}
	}
	return nil
}

// RunTask desires a task with the app's rootfs, environment and its space's current pool.
func (c *Core) RunTask(ctx context.Context, req *nsyncv1.RunTaskRequest) (string, error) {
	e := &rpcerr.InvalidError{}
	e.Merge("app_guid", models.ValidateGuid("app_guid", req.GetAppGuid()))
	if req.GetTaskGuid() != "" {
		e.Merge("task_guid", models.ValidateGuid("task_guid", req.GetTaskGuid()))
	}
	if req.GetCommand() == "" {
		e.Add("command", "is required")
	}
	if req.GetMemoryMb() < 0 || req.GetDiskMb() < 0 {
		e.Add("memory_mb", "memory_mb and disk_mb must not be negative")
	}
	if err := e.Err(); err != nil {
		return "", err
	}
	cur, err := c.getApp(ctx, req.GetAppGuid())
	if err != nil {
		return "", err
	}
	app := cur.Record.GetApp()
	rootfs, constraint, err := c.placement(ctx, "app", app)
	if err != nil {
		return "", err
	}
	r := proto.Clone(req).(*nsyncv1.RunTaskRequest)
	if r.TaskGuid == "" {
		r.TaskGuid = uuid.NewString()
	}
	t, err := c.cfg.Transformer.Task(ctx, build.Task(app, r, build.Work{Rootfs: rootfs, Constraint: constraint}))
	if err != nil {
		return "", fmt.Errorf("transform task %s: %w", r.GetTaskGuid(), err)
	}
	if err := models.ValidateTaskDefinition("definition", t.GetDefinition(), c.cfg.Limits); err != nil {
		return "", err
	}
	if _, err := c.bbs.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: t.GetTaskGuid(), Domain: t.GetDomain(), Definition: t.GetDefinition()}); err != nil {
		return "", err
	}
	return t.GetTaskGuid(), nil
}

// Apps lists the recorded apps (of space, or the given guids) with what runs of them.
func (c *Core) Apps(ctx context.Context, req *nsyncv1.AppsRequest) ([]*nsyncv1.AppInfo, error) {
	recs, _, err := c.store.Apps(ctx)
	if err != nil {
		return nil, err
	}
	pools, err := c.store.AllPools(ctx)
	if err != nil {
		return nil, err
	}
	// nsync's records are its own: with the BBS unreachable they are still the answer, with
	// the instance counts marked unknown.
	actuals, err := c.bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{Domain: build.AppsDomain}})
	countsUnknown := false
	if err != nil {
		unreachable := status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded
		if !unreachable || ctx.Err() != nil {
			return nil, err
		}
		c.log.Warn("apps: the BBS is unreachable; answering with instance counts unknown", "error", err)
		countsUnknown = true
	}
	byGuid := map[string][]*modelsv1.ActualLRP{}
	for _, a := range actuals.GetActualLrps() {
		pg := a.GetKey().GetProcessGuid()
		byGuid[pg] = append(byGuid[pg], a)
	}
	var out []*nsyncv1.AppInfo
	for _, r := range recs {
		rec := r.Record
		app := rec.GetApp()
		if rec.GetState() == nsyncv1.AppState_APP_STATE_DELETED {
			continue
		}
		if req.GetSpaceGuid() != "" && app.GetSpaceGuid() != req.GetSpaceGuid() {
			continue
		}
		if len(req.GetGuids()) > 0 && !slices.Contains(req.GetGuids(), app.GetGuid()) {
			continue
		}
		info := &nsyncv1.AppInfo{
			App:                 app,
			State:               rec.GetState(),
			PlacementConstraint: rec.GetPlacementConstraint(),
			PendingVersion:      rec.GetPendingVersion(),
			PlacementError:      rec.GetLastError(),
			RestartToApply:      !models.SameConstraint(rec.GetPlacementConstraint(), build.Constraint(pools.For(app.GetSpaceGuid()))),
			CountsUnknown:       countsUnknown,
			Deployment:          rec.GetDeployment(),
		}
		if rec.GetState() == nsyncv1.AppState_APP_STATE_STARTED {
			info.ProcessGuid = build.ProcessGuid(app.GetGuid(), app.GetVersion())
			info.Desired = app.GetInstances()
		}
		for _, v := range build.LiveVersions(rec) {
			for _, a := range byGuid[build.ProcessGuid(app.GetGuid(), v)] {
				if pe := a.GetPlacementError(); pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED && (v == app.GetVersion() || v == rec.GetDeployment().GetToVersion()) {
					info.PlacementError = pe
				}
				if v != app.GetVersion() || a.GetPresence() != modelsv1.ActualLRP_PRESENCE_ORDINARY {
					continue
				}
				switch {
				case a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && a.GetDrainingSince() == nil: // a draining one is on its way out
					info.Running++
				case a.GetState() == modelsv1.ActualLRP_STATE_CRASHED:
					info.Crashed++
				}
			}
		}
		out = append(out, info)
	}
	return out, nil
}
