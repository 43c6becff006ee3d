// Package build turns nsync's apps into DesiredLRPs and tasks: pure functions over an app, the
// stack map and a placement constraint, with the validation of what a platform sends.
package build

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/labels"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Domains and the names nsync puts on the work it desires.
const (
	// AppsDomain is the domain of every app's LRPs.
	AppsDomain = "cf-apps"
	// TasksDomain is the domain of every task nsync runs.
	TasksDomain = "cf-tasks"
	// CFRouter is the routing provider the app's routes are stored under.
	CFRouter = "cf-router"

	// PropAppGuid, PropSpaceGuid and PropAppName are the properties of every LRP and task.
	PropAppGuid, PropSpaceGuid, PropAppName = "app_guid", "space_guid", "app_name"
	// LabelApp and LabelSpace are the labels of every LRP and task (usable as selectors);
	// LabelVersion is the LRP's app version.
	LabelApp, LabelSpace, LabelVersion = "app", "space", "version"

	// MaxAppGuidLength bounds app guids so that they are label values.
	MaxAppGuidLength = 63
)

// LiveVersions are the versions of a started app that should be desired at the BBS: its
// version, during a restart the pending one, and during a deployment both of its versions
// (none unless the app is started).
func LiveVersions(rec *nsyncv1.AppRecord) []int64 {
	if rec.GetState() != nsyncv1.AppState_APP_STATE_STARTED {
		return nil
	}
	v := []int64{rec.GetApp().GetVersion()}
	if p := rec.GetPendingVersion(); p != 0 {
		v = append(v, p)
	}
	if d := rec.GetDeployment(); deploying(d) {
		for _, dv := range []int64{d.GetFromVersion(), d.GetToVersion()} {
			if !slices.Contains(v, dv) {
				v = append(v, dv)
			}
		}
	}
	return v
}

// deploying reports whether d is an active (running or paused) deployment.
func deploying(d *nsyncv1.Deployment) bool {
	s := d.GetState()
	return s == nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING || s == nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED
}

// Instances is how many instances version v of the recorded app should have at the BBS: the
// deployment's count for its versions, the app's instances otherwise.
func Instances(rec *nsyncv1.AppRecord, v int64) int32 {
	if d := rec.GetDeployment(); deploying(d) {
		switch v {
		case d.GetToVersion():
			return d.GetNewDesired()
		case d.GetFromVersion():
			return d.GetOldDesired()
		}
	}
	return rec.GetApp().GetInstances()
}

// SpreadWith is the spread peer version v's LRP is desired with (DesiredLRP.spread_with):
// during an active deployment its new LRP (the to_version; a revert's is the old version)
// spreads with the other version's LRP over the app's instance count, so that the auctioneer
// counts the other version's instances that outlive each step when it places the new ones.
// Every other version has none (nil).
func SpreadWith(rec *nsyncv1.AppRecord, v int64) *modelsv1.SpreadWith {
	d := rec.GetDeployment()
	if !deploying(d) || v != d.GetToVersion() || d.GetFromVersion() == d.GetToVersion() {
		return nil
	}
	return &modelsv1.SpreadWith{
		ProcessGuid:    ProcessGuid(rec.GetApp().GetGuid(), d.GetFromVersion()),
		TotalInstances: rec.GetApp().GetInstances(),
	}
}

// VersionWork is version v of the recorded app as it is desired at the BBS: the version's
// definition with the app's current routes, the version's instance count (Instances) and
// version set, and its rootfs and constraint.
func VersionWork(rec *nsyncv1.AppRecord, v int64) (*nsyncv1.App, Work) {
	def, w := rec.GetApp(), Work{Rootfs: rec.GetRootfs(), Constraint: rec.GetPlacementConstraint()}
	switch {
	case v == rec.GetApp().GetVersion():
	case v == rec.GetPendingVersion():
		w = Work{Rootfs: rec.GetPendingRootfs(), Constraint: rec.GetPendingConstraint()}
	default:
		for _, av := range rec.GetVersions() {
			if av.GetVersion() == v {
				def, w = av.GetApp(), Work{Rootfs: av.GetRootfs(), Constraint: av.GetPlacementConstraint()}
				break
			}
		}
	}
	app := proto.Clone(def).(*nsyncv1.App)
	app.Routes, app.Instances, app.Version = rec.GetApp().GetRoutes(), Instances(rec, v), v
	return app, w
}

// LRPUpdateFor is the in-place update that brings version v's LRP to the app's routes and the
// version's instance count (Instances).
func LRPUpdateFor(rec *nsyncv1.AppRecord, v int64) (*modelsv1.DesiredLRPUpdate, error) {
	u, err := LRPUpdate(rec.GetApp())
	if err != nil {
		return nil, err
	}
	n := Instances(rec, v)
	u.Instances = &n
	return u, nil
}

// SameRunnable reports whether a and b define the same runnable app: everything but
// instances, routes and version (which change in place) is equal.
func SameRunnable(a, b *nsyncv1.App) bool {
	norm := func(x *nsyncv1.App) *nsyncv1.App {
		c := proto.Clone(x).(*nsyncv1.App)
		c.Instances, c.Routes, c.Version = 0, nil, 0
		if c.HealthCheck != nil && proto.Size(c.HealthCheck) == 0 {
			c.HealthCheck = nil
		}
		return c
	}
	return proto.Equal(norm(a), norm(b))
}

// ValidateRoutePorts checks that every entry of the app's cf-router document routes to one of
// its ports: a deploy that changes the ports must change the routes with them.
func ValidateRoutePorts(field string, app *nsyncv1.App) error {
	for i, entry := range app.GetRoutes().GetListValue().GetValues() {
		pv, ok := entry.GetStructValue().GetFields()["port"]
		if !ok {
			continue
		}
		if port := pv.GetNumberValue(); !slices.Contains(app.GetPorts(), uint32(port)) {
			return rpcerr.Invalid(fmt.Sprintf("%s[%d].port", field, i), "routes to port %v, which is not one of the app's ports %v", port, app.GetPorts())
		}
	}
	return nil
}

// LRPUpdate is the in-place update that brings an LRP to the app's instances and routes.
func LRPUpdate(app *nsyncv1.App) (*modelsv1.DesiredLRPUpdate, error) {
	routes, err := RoutesJSON(app.GetRoutes())
	if err != nil {
		return nil, err
	}
	n := app.GetInstances()
	return &modelsv1.DesiredLRPUpdate{Instances: &n, Routes: &modelsv1.RoutesUpdate{Routes: routes}}, nil
}

// ProcessGuid is the process guid of version of app guid.
func ProcessGuid(appGuid string, version int64) string {
	return appGuid + "-v" + strconv.FormatInt(version, 10)
}

// Stacks maps a stack name to its rootfs URI, e.g. "cflinuxfs4" → "preloaded:cflinuxfs4".
type Stacks map[string]string

// Rootfs returns the rootfs of app: its stack's, or its docker image as a docker:// URI.
func (s Stacks) Rootfs(field string, app *nsyncv1.App) (string, error) {
	if img := app.GetDockerImage(); img != "" {
		return DockerRootfs(field+".docker_image", img)
	}
	stack := app.GetStack()
	if r, ok := s[strings.ToLower(stack)]; ok {
		return r, nil
	}
	known := slices.Sorted(maps.Keys(s))
	return "", rpcerr.Invalid(field+".stack", "unknown stack %q (known stacks: %s)", stack, strings.Join(known, ", "))
}

// DockerRootfs turns a docker image reference ("redis:7", "registry:5000/team/app@sha256:…")
// into a docker:// rootfs URI ("docker:///library/redis#7").
func DockerRootfs(field, image string) (string, error) {
	ref, err := name.ParseReference(image)
	if err != nil {
		return "", rpcerr.Invalid(field, "is not a valid docker image reference: %v", err)
	}
	host := ref.Context().RegistryStr()
	if host == name.DefaultRegistry {
		host = ""
	}
	return "docker://" + host + "/" + ref.Context().RepositoryStr() + "#" + ref.Identifier(), nil
}

// ValidateApp checks what a platform sends in DesireApp (version is ignored: nsync assigns it).
func ValidateApp(field string, app *nsyncv1.App, l models.Limits) error {
	e := &rpcerr.InvalidError{}
	if app == nil {
		e.Add(field, "is required")
		return e.Err()
	}
	sub := func(n string) string { return field + "." + n }
	if err := models.ValidateGuid(sub("guid"), app.GetGuid()); err != nil {
		e.Merge(sub("guid"), err)
	} else if len(app.GetGuid()) > MaxAppGuidLength {
		e.Add(sub("guid"), "must be at most %d characters, got %d", MaxAppGuidLength, len(app.GetGuid()))
	} else if err := labels.ValidateValue(app.GetGuid()); err != nil {
		e.Add(sub("guid"), "must be usable as a label value: %v", err)
	}
	if app.GetName() == "" {
		e.Add(sub("name"), "is required")
	}
	if err := models.ValidateGuid(sub("space_guid"), app.GetSpaceGuid()); err != nil {
		e.Merge(sub("space_guid"), err)
	} else if len(app.GetSpaceGuid()) > MaxAppGuidLength {
		e.Add(sub("space_guid"), "must be at most %d characters, got %d", MaxAppGuidLength, len(app.GetSpaceGuid()))
	} else if err := labels.ValidateValue(app.GetSpaceGuid()); err != nil {
		e.Add(sub("space_guid"), "must be usable as a label value: %v", err)
	}
	switch {
	case app.GetStack() == "" && app.GetDockerImage() == "":
		e.Add(sub("stack"), "one of stack and docker_image is required")
	case app.GetStack() != "" && app.GetDockerImage() != "":
		e.Add(sub("docker_image"), "must not be set together with stack %q", app.GetStack())
	}
	if len(strings.Fields(app.GetCommand())) == 0 {
		e.Add(sub("command"), "is required")
	}
	if n := app.GetInstances(); n < 0 {
		e.Add(sub("instances"), "must not be negative, got %d", n)
	}
	if app.GetMemoryMb() <= 0 {
		e.Add(sub("memory_mb"), "must be positive, got %d", app.GetMemoryMb())
	}
	if app.GetDiskMb() <= 0 {
		e.Add(sub("disk_mb"), "must be positive, got %d", app.GetDiskMb())
	}
	seen := map[string]bool{}
	for i, name := range app.GetSecretEnv() {
		f := fmt.Sprintf("%s[%d]", sub("secret_env"), i)
		if _, ok := app.GetEnv()[name]; !ok {
			e.Add(f, "names %q, which is not in env", name)
		} else if seen[name] {
			e.Add(f, "names %q twice", name)
		}
		seen[name] = true
	}
	if err := ValidateRoutes(sub("routes"), app.GetRoutes()); err != nil {
		e.Merge(sub("routes"), err)
	}
	hc := app.GetHealthCheck()
	switch hc.GetType() {
	case nsyncv1.HealthCheck_TYPE_HTTP:
		if !strings.HasPrefix(hc.GetHttpEndpoint(), "/") {
			e.Add(sub("health_check.http_endpoint"), "must be a path starting with '/', got %q", hc.GetHttpEndpoint())
		}
		fallthrough
	case nsyncv1.HealthCheck_TYPE_UNSPECIFIED, nsyncv1.HealthCheck_TYPE_PORT:
		if len(app.GetPorts()) == 0 && hc.GetType() != nsyncv1.HealthCheck_TYPE_UNSPECIFIED {
			e.Add(sub("health_check.type"), "%s needs a port", hc.GetType())
		}
	}
	if hc.GetIntervalMs() < 0 || hc.GetTimeoutMs() < 0 {
		e.Add(sub("health_check"), "interval_ms and timeout_ms must not be negative")
	}
	return e.Err()
}

// ValidateRoutes checks a cf-router document: absent, null, or a JSON array of objects.
func ValidateRoutes(field string, v *structpb.Value) error {
	if v == nil {
		return nil
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		return nil
	case *structpb.Value_ListValue:
		for i, entry := range k.ListValue.GetValues() {
			if entry.GetStructValue() == nil {
				return rpcerr.Invalid(fmt.Sprintf("%s[%d]", field, i), "must be an object {port, routes, ...}")
			}
		}
		return nil
	default:
		return rpcerr.Invalid(field, "must be the cf-router document, a JSON array [{port, routes, ...}]")
	}
}

// RoutesJSON is the stored form of a cf-router document: the BBS routes map, empty without
// routes.
func RoutesJSON(v *structpb.Value) (map[string][]byte, error) {
	if _, null := v.GetKind().(*structpb.Value_NullValue); v.GetKind() == nil || null {
		return map[string][]byte{}, nil
	}
	b, err := protojson.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	// protojson varies its whitespace from build to build on purpose; the stored bytes must not
	// (the bulk loop compares them to find drift), so they are compacted.
	var compact bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	return map[string][]byte{CFRouter: compact.Bytes()}, nil
}

// Work is what an LRP or task is built from besides the app.
type Work struct {
	// Rootfs is the rootfs URI.
	Rootfs string
	// Constraint is the placement constraint (nil: anywhere).
	Constraint *modelsv1.PlacementConstraint
}

// LRP builds version of app as a DesiredLRP.
func LRP(app *nsyncv1.App, version int64, w Work) (*modelsv1.DesiredLRP, error) {
	routes, err := RoutesJSON(app.GetRoutes())
	if err != nil {
		return nil, err
	}
	pg := ProcessGuid(app.GetGuid(), version)
	d := &modelsv1.DesiredLRP{
		ProcessGuid:         pg,
		Domain:              AppsDomain,
		Rootfs:              w.Rootfs,
		Instances:           app.GetInstances(),
		MemoryMb:            app.GetMemoryMb(),
		DiskMb:              app.GetDiskMb(),
		PlacementConstraint: cloneConstraint(w.Constraint),
		Properties:          properties(app),
		Labels:              map[string]string{LabelApp: app.GetGuid(), LabelSpace: app.GetSpaceGuid(), LabelVersion: strconv.FormatInt(version, 10)},
		Annotation:          app.GetName(),
		Routes:              routes,
		Ports:               slices.Clone(app.GetPorts()),
		Env:                 env(app),
		Action:              runAction(app.GetCommand()),
		CheckDefinition:     checks(app),
		StartTimeoutMs:      app.GetHealthCheck().GetTimeoutMs(),
		LogGuid:             app.GetGuid(),
	}
	return d, nil
}

// Task builds a one-off task of app as a Task of domain cf-tasks.
func Task(app *nsyncv1.App, req *nsyncv1.RunTaskRequest, w Work) *modelsv1.Task {
	mem, disk := req.GetMemoryMb(), req.GetDiskMb()
	if mem == 0 {
		mem = app.GetMemoryMb()
	}
	if disk == 0 {
		disk = app.GetDiskMb()
	}
	props := properties(app)
	return &modelsv1.Task{
		TaskGuid: req.GetTaskGuid(),
		Domain:   TasksDomain,
		Definition: &modelsv1.TaskDefinition{
			Rootfs:              w.Rootfs,
			Action:              runAction(req.GetCommand()),
			MemoryMb:            mem,
			DiskMb:              disk,
			PlacementConstraint: cloneConstraint(w.Constraint),
			Properties:          props,
			Labels:              map[string]string{LabelApp: app.GetGuid(), LabelSpace: app.GetSpaceGuid()},
			Annotation:          req.GetName(),
			Env:                 env(app),
			LogGuid:             app.GetGuid(),
		},
	}
}

func properties(app *nsyncv1.App) map[string]string {
	return map[string]string{PropAppGuid: app.GetGuid(), PropSpaceGuid: app.GetSpaceGuid(), PropAppName: app.GetName()}
}

func cloneConstraint(c *modelsv1.PlacementConstraint) *modelsv1.PlacementConstraint {
	if c == nil || len(c.GetRequire())+len(c.GetDisallow()) == 0 {
		return nil
	}
	return proto.Clone(c).(*modelsv1.PlacementConstraint)
}

// env is the app's environment sorted by name, so that the same app builds the same LRP; the
// entries secret_env names are marked secret.
func env(app *nsyncv1.App) []*modelsv1.EnvironmentVariable {
	m := app.GetEnv()
	var out []*modelsv1.EnvironmentVariable
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, &modelsv1.EnvironmentVariable{Name: k, Value: m[k], Secret: slices.Contains(app.GetSecretEnv(), k)})
	}
	return out
}

// RedactApp returns app with the values secret_env names replaced by models.Redacted, for a
// caller without the read-secrets capability: app itself when it has no secret value, else a
// copy (the record is never changed).
func RedactApp(app *nsyncv1.App) *nsyncv1.App {
	if !slices.ContainsFunc(app.GetSecretEnv(), func(k string) bool { v, ok := app.GetEnv()[k]; return ok && v != "" && v != models.Redacted }) {
		return app
	}
	out := proto.Clone(app).(*nsyncv1.App)
	for _, k := range out.GetSecretEnv() {
		if _, ok := out.Env[k]; ok {
			out.Env[k] = models.Redacted
		}
	}
	return out
}

func runAction(command string) *modelsv1.Action {
	f := strings.Fields(command)
	if len(f) == 0 {
		return nil
	}
	return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: f[0], Args: f[1:]}}}
}

// checks is the app's health check on its first port.
func checks(app *nsyncv1.App) *modelsv1.CheckDefinition {
	hc := app.GetHealthCheck()
	if len(app.GetPorts()) == 0 || hc.GetType() == nsyncv1.HealthCheck_TYPE_PROCESS {
		return nil
	}
	port := app.GetPorts()[0]
	var c *modelsv1.Check
	if hc.GetType() == nsyncv1.HealthCheck_TYPE_HTTP {
		c = &modelsv1.Check{Kind: &modelsv1.Check_Http{Http: &modelsv1.HTTPCheck{Port: port, Path: hc.GetHttpEndpoint(), IntervalMs: hc.GetIntervalMs()}}}
	} else {
		c = &modelsv1.Check{Kind: &modelsv1.Check_Tcp{Tcp: &modelsv1.TCPCheck{Port: port, IntervalMs: hc.GetIntervalMs()}}}
	}
	return &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{c}}
}

// Constraint is the placement constraint of a pool (nil for none).
func Constraint(p *nsyncv1.PlacementPool) *modelsv1.PlacementConstraint {
	if p == nil {
		return nil
	}
	return cloneConstraint(&modelsv1.PlacementConstraint{Require: p.GetRequire(), Disallow: p.GetDisallow()})
}

// ValidatePool checks a pool: a name like a domain and tags like cell tags.
func ValidatePool(field string, p *nsyncv1.PlacementPool) error {
	e := &rpcerr.InvalidError{}
	if p == nil {
		e.Add(field, "is required")
		return e.Err()
	}
	e.Merge(field+".name", ValidatePoolName(field+".name", p.GetName()))
	e.Merge(field, models.ValidatePlacementConstraint(field, &modelsv1.PlacementConstraint{Require: p.GetRequire(), Disallow: p.GetDisallow()}))
	return e.Err()
}

// ValidatePoolName checks a pool name: letters, digits, '-', '_' and '.', at most 128.
func ValidatePoolName(field, n string) error { return models.ValidateDomain(field, n) }
