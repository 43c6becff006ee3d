// Package transform is the host side of Gavel's transformer plugins: a chain of plugins, each
// an HTTP server on a UNIX socket, that augment desired LRPs and tasks before they are stored
// (the BBS runs the chain on every desire and update; nsync on what it sends to the BBS).
//
// Load describes every plugin eagerly (GET /describe) so a missing or misconfigured plugin
// stops the service at start-up, unless its failure policy is "ignore". For each object the
// chain calls the plugins in configured order (POST /transform/desired_lrp or
// /transform/task with the object's protojson; the answer is the whole object), and validates
// each answer before passing it on: same kind, same guid and domain, immutable fields
// unchanged, full model validation, and optionally the same answer twice (determinism). Every
// call is bounded by the plugin's timeout and concurrency limit, over reused connections.
//
// Failures are *Error values that unwrap to pkg/rpcerr kinds: the plugin's external errors
// become InvalidArgument, retriable errors, timeouts and unreachable sockets Unavailable,
// other plugin errors and invalid answers FailedPrecondition, malformed answers Internal.
// The message always names the plugin and, for invalid answers, the field.
package transform

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/tracing"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
)

// Chain is a loaded, ordered list of plugins. A nil or empty Chain passes objects through.
// It is safe for concurrent use.
type Chain struct {
	plugins []*client
	log     hclog.Logger
	limits  models.Limits
}

// Option adjusts a Chain.
type Option func(*Chain)

// WithLimits validates plugin answers against l (default models.DefaultLimits()), so a host
// with raised limits accepts what it would accept from a client.
func WithLimits(l models.Limits) Option { return func(c *Chain) { c.limits = l } }

// Load validates the configuration and describes every plugin. A plugin that cannot be
// described, or whose description does not match its configuration (name, kinds), fails Load
// with a message naming the plugin and its socket, unless its failure policy is "ignore": then
// the problem is logged and the plugin is described again before its next call. reg may be nil.
func Load(ctx context.Context, plugins []PluginConfig, logger hclog.Logger, reg prometheus.Registerer, opts ...Option) (*Chain, error) {
	if err := ValidateChain(plugins); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	c := &Chain{log: logger, limits: models.DefaultLimits()}
	for _, o := range opts {
		o(c)
	}
	if len(plugins) == 0 {
		return c, nil
	}
	m := newMetrics(reg)
	for _, pc := range plugins {
		cl := newClient(pc.WithDefaults(), m)
		if fi, err := os.Stat(cl.cfg.Socket); err == nil && fi.Mode().Perm()&0o002 != 0 {
			logger.Warn("transformer socket is writable by every user; restrict its permissions", "plugin", cl.cfg.Name, "socket", cl.cfg.Socket, "mode", fi.Mode().Perm().String())
		}
		if err := cl.describe(ctx); err != nil {
			if cl.cfg.FailurePolicy != PolicyIgnore {
				cl.close()
				_ = c.Close()
				return nil, err
			}
			logger.Warn("transformer not described; failure_policy ignore: describing it again before its next call", "plugin", cl.cfg.Name, "socket", cl.cfg.Socket, "error", err)
		} else {
			logger.Info("transformer loaded", "plugin", cl.cfg.Name, "socket", cl.cfg.Socket, "version", cl.version, "kinds", strings.Join(cl.kinds, ","), "failure_policy", cl.cfg.FailurePolicy, "timeout", cl.cfg.Timeout.String())
		}
		c.plugins = append(c.plugins, cl)
	}
	return c, nil
}

// Len is the number of plugins in the chain.
func (c *Chain) Len() int {
	if c == nil {
		return 0
	}
	return len(c.plugins)
}

// Close closes the connections kept open to the plugins.
func (c *Chain) Close() error {
	if c == nil {
		return nil
	}
	for _, cl := range c.plugins {
		cl.close()
	}
	return nil
}

// DesiredLRP runs lrp through every plugin configured for desired LRPs, in order, and returns
// the last answer (lrp itself when no plugin ran). lrp is not modified.
func (c *Chain) DesiredLRP(ctx context.Context, lrp *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
	if c.Len() == 0 {
		return lrp, nil
	}
	return run(ctx, c, plugin.KindDesiredLRP, lrp.GetProcessGuid(), lrp, func(in, out *modelsv1.DesiredLRP) *fieldError {
		return checkDesiredLRP(in, out, c.limits)
	})
}

// Task runs task (its guid, domain and definition) through every plugin configured for tasks,
// in order, and returns the last answer (task itself when no plugin ran). task is not
// modified. Plugins may change only the definition.
func (c *Chain) Task(ctx context.Context, task *modelsv1.Task) (*modelsv1.Task, error) {
	if c.Len() == 0 {
		return task, nil
	}
	return run(ctx, c, plugin.KindTask, task.GetTaskGuid(), task, func(in, out *modelsv1.Task) *fieldError {
		return checkTask(in, out, c.limits)
	})
}

// run passes obj through the chain's plugins for kind.
func run[T proto.Message](ctx context.Context, c *Chain, kind, guid string, obj T, check func(in, out T) *fieldError) (T, error) {
	cur := obj
	for _, cl := range c.plugins {
		out, err := step(ctx, cl, kind, cur, check)
		if err == nil {
			cur = out
			continue
		}
		if ctx.Err() != nil {
			var zero T
			return zero, fmt.Errorf("transformer %q (%s): %w", cl.cfg.Name, kind, ctx.Err())
		}
		if cl.cfg.FailurePolicy == PolicyIgnore {
			c.log.Warn("transformer failed; failure_policy ignore: passing its input on unchanged",
				"plugin", cl.cfg.Name, "kind", kind, "guid", guid, "error", err)
			continue
		}
		var zero T
		return zero, err
	}
	return cur, nil
}

// step calls one plugin (twice when checking determinism) and validates its answer; it
// returns in itself when the plugin is not configured for kind.
func step[T proto.Message](ctx context.Context, cl *client, kind string, in T, check func(in, out T) *fieldError) (T, error) {
	var zero T
	handles, err := cl.ready(ctx, kind)
	if err != nil {
		cl.countError(kind, err)
		return zero, err
	}
	if !handles {
		return in, nil
	}
	out, err := cl.call(ctx, kind, in)
	if err != nil {
		cl.countError(kind, err)
		return zero, err
	}
	if cl.cfg.CheckDeterminism {
		again, err := cl.call(ctx, kind, in)
		if err != nil {
			cl.countError(kind, err)
			return zero, err
		}
		if f := firstDiff(out, again); f != "" {
			err := cl.fail(kind, ClassNondeterministic, kind+"."+f,
				"not deterministic: two calls with the same %s answered different %s", kind, kind+"."+f)
			cl.countError(kind, err)
			return zero, err
		}
	}
	if fe := check(in, out.(T)); fe != nil {
		err := cl.fail(kind, ClassInvalidOutput, fe.field, "invalid answer: %s", fe.msg)
		cl.countError(kind, err)
		return zero, err
	}
	return out.(T), nil
}

// client calls one plugin over its socket.
type client struct {
	cfg  PluginConfig
	tr   *http.Transport
	http *http.Client
	sem  chan struct{}
	m    *metrics

	mu        sync.Mutex
	described bool
	kinds     []string // the kinds it is called for, once described
	version   string
}

func newClient(cfg PluginConfig, m *metrics) *client {
	socket := cfg.Socket
	dialer := &net.Dialer{}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:        cfg.MaxConcurrency,
		MaxIdleConnsPerHost: cfg.MaxConcurrency,
		MaxConnsPerHost:     cfg.MaxConcurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &client{cfg: cfg, tr: tr, http: &http.Client{Transport: tr}, sem: make(chan struct{}, cfg.MaxConcurrency), m: m}
}

func (cl *client) close() { cl.tr.CloseIdleConnections() }

func (cl *client) fail(kind string, class Class, field, format string, args ...any) *Error {
	return &Error{Plugin: cl.cfg.Name, Socket: cl.cfg.Socket, Kind: kind, Class: class, Field: field, Message: fmt.Sprintf(format, args...)}
}

func (cl *client) countError(kind string, err error) {
	class := "canceled"
	var e *Error
	if errors.As(err, &e) {
		class = string(e.Class)
	}
	cl.m.errors.WithLabelValues(cl.cfg.Name, kind, class).Inc()
}

// ready describes the plugin when it has not been described yet and reports whether it is
// called for kind.
func (cl *client) ready(ctx context.Context, kind string) (bool, error) {
	if len(cl.cfg.Kinds) > 0 && !slices.Contains(cl.cfg.Kinds, kind) {
		return false, nil
	}
	cl.mu.Lock()
	described := cl.described
	cl.mu.Unlock()
	if !described {
		if err := cl.describe(ctx); err != nil {
			var e *Error
			if errors.As(err, &e) {
				e.Kind = kind
			}
			return false, err
		}
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return slices.Contains(cl.kinds, kind), nil
}

// describe asks the plugin for its description and checks it against the configuration.
func (cl *client) describe(ctx context.Context) error {
	status, body, err := cl.do(ctx, "describe", http.MethodGet, plugin.PathDescribe, nil)
	if err != nil {
		err.Class, err.Message = ClassDescribe, "describe at "+cl.cfg.Socket+": "+err.Message
		return err
	}
	bad := func(format string, args ...any) error {
		return cl.fail("describe", ClassDescribe, "", "describe at %s: %s", cl.cfg.Socket, fmt.Sprintf(format, args...))
	}
	if status != http.StatusOK {
		return bad("answered HTTP %d: %s", status, excerpt(body))
	}
	var d plugin.Description
	if err := json.Unmarshal(body, &d); err != nil {
		return bad("answer is not JSON {\"name\",\"kinds\",\"version\"}: %v: %s", err, excerpt(body))
	}
	if d.Name != cl.cfg.Name {
		return bad("the plugin names itself %q, configured as %q", d.Name, cl.cfg.Name)
	}
	if len(d.Kinds) == 0 {
		return bad("the plugin lists no kinds")
	}
	for _, k := range d.Kinds {
		if !knownKind(k) {
			return bad("the plugin lists unknown kind %q (want %q or %q)", k, plugin.KindDesiredLRP, plugin.KindTask)
		}
	}
	kinds := d.Kinds
	if len(cl.cfg.Kinds) > 0 {
		for _, k := range cl.cfg.Kinds {
			if !slices.Contains(d.Kinds, k) {
				return bad("the plugin lists kinds [%s] but is configured for [%s]: it does not transform %q",
					strings.Join(d.Kinds, ","), strings.Join(cl.cfg.Kinds, ","), k)
			}
		}
		kinds = cl.cfg.Kinds
	}
	cl.mu.Lock()
	cl.described, cl.kinds, cl.version = true, slices.Clone(kinds), d.Version
	cl.mu.Unlock()
	return nil
}

// call posts in to the plugin and parses the answer as the same kind.
func (cl *client) call(ctx context.Context, kind string, in proto.Message) (out proto.Message, err error) {
	// One span per plugin call, in the caller's trace (the desire's); the plugin gets the W3C
	// trace context in its request headers (do) to continue it.
	ctx, span := tracing.Tracer("transform").Start(ctx, "transform."+kind,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.String("gavel.plugin", cl.cfg.Name)))
	defer func() {
		if err != nil {
			span.SetStatus(otelcodes.Error, err.Error())
		}
		span.End()
	}()
	body, err := protojson.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("transformer %q (%s): encode request: %w", cl.cfg.Name, kind, err)
	}
	start := time.Now()
	cl.m.calls.WithLabelValues(cl.cfg.Name, kind).Inc()
	status, answer, ferr := cl.do(ctx, kind, http.MethodPost, "/transform/"+kind, body)
	cl.m.duration.WithLabelValues(cl.cfg.Name, kind).Observe(time.Since(start).Seconds())
	if ferr != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("transformer %q (%s): %w", cl.cfg.Name, kind, ctx.Err())
		}
		return nil, ferr
	}
	if status != http.StatusOK {
		var ea plugin.Error
		if err := json.Unmarshal(answer, &ea); err != nil || ea.Message == "" {
			return nil, cl.fail(kind, ClassBadAnswer, "", "answered HTTP %d without an error answer {\"error\",\"external\",\"retriable\"}: %s", status, excerpt(answer))
		}
		switch {
		case ea.External:
			return nil, cl.fail(kind, ClassExternal, "", "%s", ea.Message)
		case ea.Retriable:
			return nil, cl.fail(kind, ClassRetriable, "", "%s (retriable)", ea.Message)
		}
		return nil, cl.fail(kind, ClassPlugin, "", "%s", ea.Message)
	}
	out = in.ProtoReflect().New().Interface()
	if err := protojson.Unmarshal(answer, out); err != nil {
		if other := otherKind(kind, answer); other != "" {
			return nil, cl.fail(kind, ClassBadAnswer, "", "answered a %s where a %s was expected", other, kind)
		}
		return nil, cl.fail(kind, ClassBadAnswer, "", "answer is not a %s in protojson: %v: %s", kind, err, excerpt(answer))
	}
	return out, nil
}

// otherKind names the other kind when answer parses as one.
func otherKind(kind string, answer []byte) string {
	switch kind {
	case plugin.KindDesiredLRP:
		if protojson.Unmarshal(answer, &modelsv1.Task{}) == nil {
			return plugin.KindTask
		}
	case plugin.KindTask:
		if protojson.Unmarshal(answer, &modelsv1.DesiredLRP{}) == nil {
			return plugin.KindDesiredLRP
		}
	}
	return ""
}

// do makes one request within the plugin's timeout (a free slot included) and reads the
// answer.
func (cl *client) do(ctx context.Context, kind, method, path string, body []byte) (int, []byte, *Error) {
	timeout := time.Duration(cl.cfg.Timeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	select {
	case cl.sem <- struct{}{}:
		defer func() { <-cl.sem }()
	case <-ctx.Done():
		return 0, nil, cl.fail(kind, ClassTimeout, "", "no free slot of %d within the timeout of %s", cl.cfg.MaxConcurrency, timeout)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+cl.cfg.Name+path, rd)
	if err != nil {
		return 0, nil, cl.fail(kind, ClassUnreachable, "", "build request: %v", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := cl.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, cl.fail(kind, ClassTimeout, "", "no answer within the timeout of %s", timeout)
		}
		return 0, nil, cl.fail(kind, ClassUnreachable, "", "%v", unwrapURL(err))
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, plugin.MaxBodyBytes+1))
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, cl.fail(kind, ClassTimeout, "", "answer not read within the timeout of %s", timeout)
		}
		return 0, nil, cl.fail(kind, ClassBadAnswer, "", "read answer: %v", err)
	}
	if len(answer) > plugin.MaxBodyBytes {
		return 0, nil, cl.fail(kind, ClassBadAnswer, "", "answer larger than %d bytes", plugin.MaxBodyBytes)
	}
	return resp.StatusCode, answer, nil
}

// unwrapURL drops net/http's "Post \"http://name/path\":" prefix, which names no real URL.
func unwrapURL(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

// excerpt is the start of a body for an error message.
func excerpt(b []byte) string {
	const max = 200
	s := strings.TrimSpace(string(b))
	if len(s) > max {
		return fmt.Sprintf("%q...", s[:max])
	}
	return fmt.Sprintf("%q", s)
}
