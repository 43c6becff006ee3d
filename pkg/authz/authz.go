// Package authz is least privilege by certificate identity for Gavel's gRPC servers, in the
// manner of the Kubernetes node authorizer and RBAC: a caller's identity (the spiffe:// URI SAN
// of its verified client certificate) maps to a role in the service's config file, each
// service's Policy says which calls a role may make (and may inspect the request, e.g. a rep
// changes only its own cell's work), refusals say which identity made which call, and every
// mutating call is written to an audit log with the identity, except a role's routine machine
// traffic (Methods.Quiet), written only when it fails.
//
// A server without TLS (only `gavel dev --insecure`) has no identities, so nothing is enforced.
package authz

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/pkg/tracing"
)

// Role kinds. A role is a kind, and for rep/<cell> a parameter.
const (
	// Admin may make every call.
	Admin = "admin"
	// ReadOnly may make every read (lists, gets, event and route streams).
	ReadOnly = "read-only"
	// Rep (rep/<cell>) may read and change only instances and tasks on its own cell.
	Rep = "rep"
	// Auctioneer may read and report placement failures; at a rep it may ask State and Perform.
	Auctioneer = "auctioneer"
	// RouteEmitter may read, subscribe to events and report the revision it has published.
	RouteEmitter = "route-emitter"
	// Router may read the route-emitter's table.
	Router = "router"
	// BBS is the BBS calling the auctioneer (start requests) and reps (stop, cancel).
	BBS = "bbs"
	// Nsync may read, and desire, update and remove work in the domains it is configured for.
	Nsync = "nsync"
)

// kinds lists the role kinds and whether they take a parameter.
var kinds = map[string]bool{Admin: false, ReadOnly: false, Rep: true, Auctioneer: false, RouteEmitter: false, Router: false, BBS: false, Nsync: false}

// Role is a caller's role: Kind, and Param for rep/<cell>.
type Role struct {
	// Kind is one of the role kinds (Admin, ReadOnly, Rep, ...).
	Kind string
	// Param is the cell of a rep role.
	Param string
}

// String renders the role as written in config ("rep/cell-1").
func (r Role) String() string {
	if r.Param != "" {
		return r.Kind + "/" + r.Param
	}
	return r.Kind
}

// Config maps certificate identities to roles. It is part of each service's config file.
type Config struct {
	// Roles maps a certificate identity (a spiffe:// URI) to a role: admin, read-only,
	// rep/<cell>, auctioneer, route-emitter, router, bbs or nsync. An identity ending in "*"
	// matches any suffix, and a "*" in its role is replaced by that suffix
	// ("spiffe://gavel/rep/*": "rep/*" gives each rep the role of its own cell). The longest
	// matching identity wins.
	Roles map[string]string `json:"roles"`
	// NsyncDomains are the domains an nsync identity may desire, update and remove work in.
	NsyncDomains []string `json:"nsync_domains"`
	// SecretReaders are the role kinds that hold the read-secrets capability: they see the
	// values of env vars marked secret, which every other role sees redacted. A rep holds it
	// only for the work of its own cell (the BBS decides which work that is). Default: admin
	// and rep; an empty list leaves every secret redacted in every answer.
	SecretReaders []string `json:"secret_readers"`
}

// ReadSecrets is the capability to read the values of secret env vars (Config.SecretReaders).
const ReadSecrets = "read-secrets"

// Default maps the identities `gavel certs` writes (spiffe://gavel/<name>) to the role of the
// same name, every rep certificate to its own cell, and lets nsync work in cf-apps and cf-tasks.
func Default() Config {
	return Config{
		Roles: map[string]string{
			"spiffe://gavel/admin":         Admin,
			"spiffe://gavel/read-only":     ReadOnly,
			"spiffe://gavel/rep/*":         "rep/*",
			"spiffe://gavel/auctioneer":    Auctioneer,
			"spiffe://gavel/route-emitter": RouteEmitter,
			"spiffe://gavel/router":        Router,
			"spiffe://gavel/bbs":           BBS,
			"spiffe://gavel/nsync":         Nsync,
		},
		NsyncDomains:  []string{"cf-apps", "cf-tasks"},
		SecretReaders: []string{Admin, Rep},
	}
}

// MayReadSecrets reports whether role holds the read-secrets capability (for a rep: for the
// work of its own cell).
func (c Config) MayReadSecrets(role Role) bool {
	return contains(c.SecretReaders, role.Kind)
}

// Validate reports an unknown role or a malformed identity pattern.
func (c Config) Validate() error {
	var errs []error
	for _, id := range sortedKeys(c.Roles) {
		if id == "" || strings.Contains(strings.TrimSuffix(id, "*"), "*") {
			errs = append(errs, fmt.Errorf("roles: identity %q: want a URI, optionally ending in *", id))
			continue
		}
		role := c.Roles[id]
		kind, param, _ := strings.Cut(role, "/")
		takesParam, ok := kinds[kind]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("roles: %s: unknown role %q (want admin, read-only, rep/<cell>, auctioneer, route-emitter, router, bbs or nsync)", id, role))
		case takesParam && param == "":
			errs = append(errs, fmt.Errorf("roles: %s: role %q needs a cell (rep/<cell> or rep/*)", id, role))
		case !takesParam && param != "":
			errs = append(errs, fmt.Errorf("roles: %s: role %q takes no parameter", id, role))
		case strings.Contains(param, "*") && !strings.HasSuffix(id, "*"):
			errs = append(errs, fmt.Errorf("roles: %s: role %q uses * but the identity has none", id, role))
		}
	}
	for _, kind := range c.SecretReaders {
		if _, ok := kinds[kind]; !ok {
			errs = append(errs, fmt.Errorf("secret_readers: unknown role %q (want admin, read-only, rep, auctioneer, route-emitter, router, bbs or nsync)", kind))
		}
	}
	return errors.Join(errs...)
}

// RoleOf returns the role of identity, by the longest matching entry.
func (c Config) RoleOf(identity string) (Role, bool) {
	best, bestLen, suffix := "", -1, ""
	for id, role := range c.Roles {
		if prefix, wild := strings.CutSuffix(id, "*"); wild {
			if strings.HasPrefix(identity, prefix) && len(prefix) > bestLen && len(identity) > len(prefix) {
				best, bestLen, suffix = role, len(prefix), identity[len(prefix):]
			}
		} else if id == identity && len(id) > bestLen {
			best, bestLen, suffix = role, len(id), ""
		}
	}
	if bestLen < 0 {
		return Role{}, false
	}
	best = strings.ReplaceAll(best, "*", suffix)
	kind, param, _ := strings.Cut(best, "/")
	return Role{Kind: kind, Param: param}, true
}

// Policy is one service's rules.
type Policy interface {
	// Allow returns nil when role may call method (the full gRPC method name) with req (nil for
	// a stream, checked before its first message), or an error saying why not.
	Allow(role Role, method string, req any) error
	// Mutating reports whether method changes state; those calls are audited.
	Mutating(method string) bool
	// Routine reports whether method is role's routine machine traffic, made at the rate of
	// the work (a rep's claims and starts, the auctioneer's Perform): audited only when it
	// fails other than by being shed for load.
	Routine(role Role, method string) bool
}

// Authorizer enforces a Policy for the identities of a Config.
type Authorizer struct {
	cfg    Config
	policy Policy
	audit  hclog.Logger
}

// New returns an Authorizer; audit receives one line per mutating call and per refusal.
func New(cfg Config, policy Policy, audit hclog.Logger) *Authorizer {
	if audit == nil {
		audit = hclog.NewNullLogger()
	}
	return &Authorizer{cfg: cfg, policy: policy, audit: audit}
}

// Config returns the authorizer's identity mapping (policies read NsyncDomains from it).
func (a *Authorizer) Config() Config { return a.cfg }

// caller is who made a call.
type caller struct {
	identity string
	role     Role
}

// Caller is who made a call, as a handler sees it (CallerFrom).
type Caller struct {
	// Identity is the caller's certificate identity; empty when Unenforced.
	Identity string
	// Role is the caller's role.
	Role Role
	// Unenforced is true for a call over plaintext (`gavel dev --insecure`): there are no
	// identities, so nothing is enforced and nothing is redacted.
	Unenforced bool
	// SecretReader is true when Role holds the read-secrets capability (Config.SecretReaders).
	// For a rep it covers only its own cell's work; the service applies that scope.
	SecretReader bool
}

// MaySeeSecrets reports whether the caller may be sent secret values at all: over plaintext,
// or with the read-secrets capability.
func (c Caller) MaySeeSecrets() bool { return c.Unenforced || c.SecretReader }

type callerKey struct{}

// CallerFrom returns the caller the authorizer attached to a call's context; ok is false when
// the call did not pass an Authorizer, and a service should then redact what it would redact
// for a caller without capabilities.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// withCaller attaches what a handler may know of the caller c (nil: a plaintext call).
func (a *Authorizer) withCaller(ctx context.Context, c *caller) context.Context {
	if c == nil {
		return context.WithValue(ctx, callerKey{}, Caller{Unenforced: true})
	}
	return context.WithValue(ctx, callerKey{}, Caller{Identity: c.identity, Role: c.role, SecretReader: a.cfg.MayReadSecrets(c.role)})
}

// callerStream is a server stream whose context carries the caller.
type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context implements grpc.ServerStream.
func (s callerStream) Context() context.Context { return s.ctx }

// authorize decides one call: plaintext calls pass (no identities exist), gRPC's own health
// and reflection services are open to any verified caller, everything else needs a known
// identity whose role the policy allows.
func (a *Authorizer) authorize(ctx context.Context, method string, req any) (*caller, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return nil, nil
	}
	if _, tlsPeer := p.AuthInfo.(credentials.TLSInfo); !tlsPeer {
		return nil, nil
	}
	id, ok := tlsx.PeerIdentity(ctx)
	if !ok {
		a.audit.Warn("refused", "identity", "", "call", method, "reason", "no verified certificate identity")
		return nil, status.Errorf(codes.Unauthenticated, "call %s: the client certificate carries no spiffe:// identity", method)
	}
	if Infrastructure(method) {
		return &caller{identity: id}, nil
	}
	role, ok := a.cfg.RoleOf(id)
	if !ok {
		a.audit.Warn("refused", "identity", id, "call", method, "reason", "no role")
		return nil, status.Errorf(codes.PermissionDenied, "identity %s has no role here and may not call %s", id, method)
	}
	if role.Kind != Admin {
		if err := a.policy.Allow(role, method, req); err != nil {
			a.audit.Warn("refused", "identity", id, "role", role.String(), "call", method, "reason", err.Error())
			return nil, status.Errorf(codes.PermissionDenied, "identity %s (role %s) may not call %s: %v", id, role, method, err)
		}
	}
	return &caller{identity: id, role: role}, nil
}

// infrastructure are the services of gRPC itself that every gRPC server registers (see
// pkg/grpcx): health checks and server reflection. They only read, so they are open to any
// verified caller and never audited.
var infrastructure = []string{
	"/" + healthpb.Health_ServiceDesc.ServiceName + "/",
	"/" + reflectionv1.ServerReflection_ServiceDesc.ServiceName + "/",
	"/" + reflectionv1alpha.ServerReflection_ServiceDesc.ServiceName + "/",
}

// Infrastructure reports whether method (a full gRPC method name) belongs to gRPC's own health
// or reflection service rather than to a Gavel API: such calls need a verified identity but no
// role, and are not audited.
func Infrastructure(method string) bool {
	for _, prefix := range infrastructure {
		if strings.HasPrefix(method, prefix) {
			return true
		}
	}
	return false
}

// record audits a finished mutating call; gRPC's health and reflection calls are reads
// whatever the policy says, so they are never audited, and a role's routine calls are audited
// only when they fail (Policy.Routine), a call shed for load (ResourceExhausted, which its
// caller retries) not counting as failed.
// The line carries the call's trace id when it has one (pkg/tracing).
func (a *Authorizer) record(ctx context.Context, c *caller, method string, err error) {
	if c == nil || Infrastructure(method) || !a.policy.Mutating(method) {
		return
	}
	code := status.Code(err)
	if (code == codes.OK || code == codes.ResourceExhausted) && a.policy.Routine(c.role, method) {
		return // routine, and done or shed for load (its caller retries it)
	}
	fields := []any{"identity", c.identity, "role", c.role.String(), "call", method, "code", code.String()}
	if id := tracing.TraceID(ctx); id != "" {
		fields = append(fields, "trace_id", id)
	}
	a.audit.Info("audit", fields...)
}

// Unary is the unary server interceptor.
func (a *Authorizer) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		c, err := a.authorize(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		resp, err := handler(a.withCaller(ctx, c), req)
		a.record(ctx, c, info.FullMethod, err)
		return resp, err
	}
}

// Stream is the stream server interceptor; streams are authorized by method.
func (a *Authorizer) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		c, err := a.authorize(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		err = handler(srv, callerStream{ServerStream: ss, ctx: a.withCaller(ss.Context(), c)})
		a.record(ss.Context(), c, info.FullMethod, err)
		return err
	}
}

// Methods is a simple Policy: each role kind may call the listed methods (short names of
// Service), reads are open to every role, and Check, when set, inspects allowed requests.
type Methods struct {
	// Service is the full service name, e.g. "gavel.bbs.v1.BBSService".
	Service string
	// Reads are the methods every known role may call; they are not audited.
	Reads []string
	// Grants maps a role kind to the further methods it may call.
	Grants map[string][]string
	// Check, when set, is asked about every allowed call of a role other than admin and may
	// refuse it (e.g. a rep acting on another cell).
	Check func(role Role, method string, req any) error
	// Quiet maps a role kind to the granted calls that are its routine machine traffic,
	// made at the rate of the work rather than by people: each is audited only when it fails,
	// so the audit log stays the record of what operators and their tools changed, as
	// Kubernetes' audit policies leave out the kubelets' status updates. The same call by
	// another role (admin) is audited as ever.
	Quiet map[string][]string
}

// Allow implements Policy.
func (m Methods) Allow(role Role, method string, req any) error {
	svc, name, ok := splitMethod(method)
	if !ok || svc != m.Service {
		return fmt.Errorf("not a %s call", m.Service)
	}
	allowed := contains(m.Reads, name) || contains(m.Grants[role.Kind], name)
	if !allowed {
		return fmt.Errorf("role %s does not grant %s", role, name)
	}
	if m.Check != nil {
		return m.Check(role, name, req)
	}
	return nil
}

// Mutating implements Policy: everything but the reads.
func (m Methods) Mutating(method string) bool {
	_, name, _ := splitMethod(method)
	return !contains(m.Reads, name)
}

// Routine implements Policy: the calls Quiet lists for role's kind.
func (m Methods) Routine(role Role, method string) bool {
	svc, name, ok := splitMethod(method)
	return ok && svc == m.Service && contains(m.Quiet[role.Kind], name)
}

// splitMethod splits "/pkg.Service/Method".
func splitMethod(full string) (svc, name string, ok bool) {
	return strings.Cut(strings.TrimPrefix(full, "/"), "/")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
