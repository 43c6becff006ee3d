// Package console is `gavel ui`: a local web console, in the manner of `nomad ui`, that shows
// a Gavel cluster (cells, LRPs, tasks, placement pools, the live event stream, one LRP's
// history, nsync's apps) and lets an admin scale an LRP, restart an app, retire an instance
// and cancel a task.
//
// The console holds no credentials of its own: it calls the BBS, nsync, the route-emitter and
// the reps with the gRPC clients it is given, which the CLI dials with the caller's
// certificate, so the services' authorization is unchanged. Pages are rendered on the server
// (html/template); the server follows the BBS event stream and pushes server-sent events, and
// a little JavaScript re-renders the parts of the open page that an event touched. Every asset
// is embedded in the binary.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

//go:embed assets
var assets embed.FS

// callTimeout bounds the calls one page or action makes.
const callTimeout = 10 * time.Second

// Config is what the console talks to and as whom.
type Config struct {
	// Listener is where the console serves HTTP (the CLI binds it, loopback by default).
	Listener net.Listener
	// BBS is a client of the BBS with the caller's certificate.
	BBS bbsv1.BBSServiceClient
	// RouteEmitter, when set, is a client of the route-emitter (the routes of LRPs).
	RouteEmitter routeemitterv1.RouteEmitterServiceClient
	// Nsync, when set, is a client of nsync (placement pools and spaces).
	Nsync nsyncv1.NsyncServiceClient
	// DialRep, when set, connects to a rep's address with the caller's certificate (the cells'
	// use comes from each rep's State).
	DialRep func(addr string) (*grpc.ClientConn, error)
	// Identity is the caller's certificate identity (a spiffe:// URI), shown on every page.
	Identity string
	// Role is the caller's role as far as the console can tell (by the documented default
	// roles); only "admin" sees action buttons. The BBS decides either way: it refuses a
	// read-only caller's action, and the console shows the refusal.
	Role string
	// Logger receives the console's logs.
	Logger hclog.Logger
}

// Server is a running console.
type Server struct {
	cfg   Config
	hub   *hub
	reps  *repClients
	csrf  string
	pages map[string]*template.Template
}

// New checks cfg and prepares the console; Run serves it.
func New(cfg Config) (*Server, error) {
	if cfg.Listener == nil || cfg.BBS == nil {
		return nil, errors.New("console: a listener and a BBS client are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	token := make([]byte, 32)
	if _, err := rand.Read(token); err != nil {
		return nil, fmt.Errorf("console: csrf token: %w", err)
	}
	s := &Server{cfg: cfg, hub: newHub(cfg.BBS), csrf: hex.EncodeToString(token), pages: map[string]*template.Template{}}
	if cfg.DialRep != nil {
		s.reps = &repClients{dial: cfg.DialRep, conns: map[string]repv1.RepServiceClient{}}
	}
	funcs := template.FuncMap{
		"list":   func(s ...string) []string { return s },
		"titles": func() map[string]string { return navTitles },
	}
	for _, name := range []string{"cells", "apps", "lrps", "lrp", "tasks", "pools", "events", "confirm", "result"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		s.pages[name] = t
	}
	return s, nil
}

// URL is where the console serves.
func (s *Server) URL() string { return "http://" + s.cfg.Listener.Addr().String() + "/" }

// Run follows the event stream and serves HTTP until ctx ends; it calls ready once the event
// stream is followed and the listener serves.
func (s *Server) Run(ctx context.Context, ready func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	followed := make(chan struct{})
	hubDone := make(chan struct{})
	go func() {
		defer close(hubDone)
		s.hub.run(ctx, func() { close(followed) })
	}()
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx }, // ends the event streams on stop
		ErrorLog:          s.cfg.Logger.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(s.cfg.Listener) }()
	select {
	case <-followed:
		ready()
	case <-ctx.Done():
	case err := <-served:
		cancel()
		<-hubDone
		return fmt.Errorf("console: %w", err)
	}
	var err error
	select {
	case <-ctx.Done():
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = srv.Shutdown(sctx)
		scancel()
	case err = <-served:
		cancel()
	}
	<-hubDone
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Handler serves the console's pages, its assets, its event stream and its actions.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "assets/static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/cells", http.StatusFound) })
	mux.HandleFunc("GET /cells", s.page("cells", "Cells", "cells", func(r *http.Request) (any, error) { return s.cellsPage(r.Context()) }))
	mux.HandleFunc("GET /apps", s.page("apps", "Apps", "lrps", func(r *http.Request) (any, error) { return s.appsPage(r.Context()) }))
	mux.HandleFunc("GET /lrps", s.page("lrps", "LRPs", "lrps", func(r *http.Request) (any, error) { return s.lrpsPage(r.Context(), "") }))
	mux.HandleFunc("GET /lrps/{guid}", s.page("lrp", "LRP", "lrps", func(r *http.Request) (any, error) { return s.lrpsPage(r.Context(), r.PathValue("guid")) }))
	mux.HandleFunc("GET /tasks", s.page("tasks", "Tasks", "tasks", func(r *http.Request) (any, error) { return s.tasksPage(r.Context()) }))
	mux.HandleFunc("GET /pools", s.page("pools", "Placement pools", "", func(r *http.Request) (any, error) { return s.poolsPage(r.Context()) }))
	mux.HandleFunc("GET /events", s.page("events", "Events", "", func(r *http.Request) (any, error) { return s.hub.recent(), nil }))
	mux.HandleFunc("GET /confirm", s.confirm)
	mux.HandleFunc("POST /act", s.act)
	mux.HandleFunc("GET /stream", s.stream)
	return mux
}

// view is what every page template gets.
type view struct {
	Name, Title, Topics string
	Identity, Role      string
	CanAct              bool
	CSRF                string
	Stream              string
	Done                string
	Error               string
	Data                any
}

func (s *Server) view(name, title, topics string) *view {
	return &view{Name: name, Title: title, Topics: topics, Identity: s.cfg.Identity, Role: s.cfg.Role,
		CanAct: s.cfg.Role == "admin", CSRF: s.csrf, Stream: s.hub.streamStatus()}
}

// page serves one page: whole, or only its main part when the page's script re-renders it
// (X-Console-Fragment).
func (s *Server) page(name, title, topics string, load func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
		defer cancel()
		v := s.view(name, title, topics)
		v.Done = r.URL.Query().Get("done")
		data, err := load(r.WithContext(ctx))
		if err != nil {
			v.Error = describeErr(err)
		}
		v.Data = data
		s.render(w, r, name, http.StatusOK, v)
	}
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, code int, v *view) {
	tmpl := "layout.html"
	if r.Header.Get("X-Console-Fragment") != "" {
		tmpl = "main"
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Frame-Options", "DENY")
	w.WriteHeader(code)
	if err := s.pages[name].ExecuteTemplate(w, tmpl, v); err != nil {
		s.cfg.Logger.Error("render", "page", name, "error", err)
	}
}

// stream sends the hub's updates as server-sent events until the page closes.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	updates, cancel := s.hub.subscribe()
	defer cancel()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fmt.Fprint(w, ": following the BBS event stream\n\n")
	flusher.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case b := <-updates:
			fmt.Fprintf(w, "data: %s\n\n", b)
			flusher.Flush()
		}
	}
}

// action is one confirmable change.
type action struct {
	Kind                  string // scale, restart, retire, cancel
	Guid                  string
	Index, Instances, Was int32
	Question, Back        string
}

// parseAction reads an action from a query or form.
func parseAction(v url.Values) (*action, error) {
	a := &action{Kind: v.Get("action"), Guid: v.Get("guid")}
	num := func(name string) (int32, error) {
		n, err := strconv.ParseInt(v.Get(name), 10, 32)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s: want a whole number ≥ 0, got %q", name, v.Get(name))
		}
		return int32(n), nil
	}
	var err error
	if a.Guid == "" {
		return nil, errors.New("guid: missing")
	}
	switch a.Kind {
	case "scale":
		if a.Instances, err = num("instances"); err != nil {
			return nil, err
		}
		a.Question = fmt.Sprintf("Scale %s to %d instances?", a.Guid, a.Instances)
		a.Back = "/lrps/" + url.PathEscape(a.Guid)
	case "retire":
		if a.Index, err = num("index"); err != nil {
			return nil, err
		}
		a.Question = fmt.Sprintf("Retire instance %d of %s? It stops; convergence places a new one while the LRP still desires it.", a.Index, a.Guid)
		a.Back = "/lrps/" + url.PathEscape(a.Guid)
	case "restart":
		a.Question = fmt.Sprintf("Restart app %s? Its next version starts beside the serving one, takes the routes once every instance runs, and the old version is drained.", a.Guid)
		a.Back = "/apps"
	case "cancel":
		a.Question = fmt.Sprintf("Cancel task %s?", a.Guid)
		a.Back = "/tasks"
	default:
		return nil, fmt.Errorf("action: unknown %q (want scale, restart, retire or cancel)", a.Kind)
	}
	return a, nil
}

// confirm asks before an action; the form it shows posts to act with the CSRF token.
func (s *Server) confirm(w http.ResponseWriter, r *http.Request) {
	v := s.view("confirm", "Confirm", "")
	a, err := parseAction(r.URL.Query())
	if err != nil {
		v.Error = err.Error()
		s.render(w, r, "result", http.StatusBadRequest, v)
		return
	}
	v.Data = a
	s.render(w, r, "confirm", http.StatusOK, v)
}

// act carries out a confirmed action with the caller's certificate. The console does not
// decide who may act: the BBS does, and its refusal is shown.
func (s *Server) act(w http.ResponseWriter, r *http.Request) {
	v := s.view("result", "Refused", "")
	if err := r.ParseForm(); err != nil {
		v.Error = err.Error()
		s.render(w, r, "result", http.StatusBadRequest, v)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(s.csrf)) != 1 || !sameOrigin(r) {
		v.Error = "refused by the console: the form did not come from this console (CSRF token or origin mismatch); reload the page and try again"
		s.render(w, r, "result", http.StatusForbidden, v)
		return
	}
	a, err := parseAction(r.PostForm)
	if err != nil {
		v.Error = err.Error()
		s.render(w, r, "result", http.StatusBadRequest, v)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	var done string
	switch a.Kind {
	case "scale":
		n := a.Instances
		_, err = s.cfg.BBS.UpdateDesiredLRP(ctx, &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: a.Guid, Update: &modelsv1.DesiredLRPUpdate{Instances: &n}})
		done = fmt.Sprintf("%s scaled to %d instances", a.Guid, n)
	case "retire":
		_, err = s.cfg.BBS.RetireActualLRP(ctx, &bbsv1.RetireActualLRPRequest{ProcessGuid: a.Guid, Index: a.Index})
		done = fmt.Sprintf("instance %d of %s retired", a.Index, a.Guid)
	case "restart":
		done, err = s.restart(a.Guid) // apps.go
	case "cancel":
		_, err = s.cfg.BBS.CancelTask(ctx, &bbsv1.CancelTaskRequest{TaskGuid: a.Guid})
		done = fmt.Sprintf("task %s cancelled", a.Guid)
	}
	s.cfg.Logger.Info("action", "action", a.Kind, "guid", a.Guid, "identity", s.cfg.Identity, "error", err)
	if err != nil {
		v.Error = "refused by " + refuser(a.Kind) + ": " + describeErr(err)
		v.Data = a
		s.render(w, r, "result", httpStatus(err), v)
		return
	}
	http.Redirect(w, r, a.Back+"?done="+url.QueryEscape(done), http.StatusSeeOther)
}

// refuser names the service that decides an action: nsync for a restart, else the BBS.
func refuser(kind string) string {
	if kind == "restart" {
		return "nsync"
	}
	return "the BBS"
}

// sameOrigin refuses a cross-site form: a browser sends Origin with every POST.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true // not a browser (a crafted request still needs the token)
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// describeErr renders a gRPC error as "Code: message".
func describeErr(err error) string {
	var inner interface{ GRPCStatus() *status.Status }
	if errors.As(err, &inner) {
		st := inner.GRPCStatus()
		return fmt.Sprintf("%s: %s", st.Code(), st.Message())
	}
	return err.Error()
}

// httpStatus maps a refusal to an HTTP status.
func httpStatus(err error) int {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.InvalidArgument, codes.FailedPrecondition:
		return http.StatusUnprocessableEntity
	}
	return http.StatusBadGateway
}

// navTitles names the pages in the navigation bar.
var navTitles = map[string]string{"cells": "Cells", "apps": "Apps", "lrps": "LRPs", "tasks": "Tasks", "pools": "Pools & spaces", "events": "Events"}
