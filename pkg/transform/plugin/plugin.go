// Package plugin serves a Gavel transformer plugin: a function of a DesiredLRP and/or a Task,
// called by the BBS (and nsync) over HTTP on a UNIX socket before the object is stored.
//
// The contract (docs/plugins.md) is plain HTTP, so a plugin can be written in any language;
// this package is the Go way to write one:
//
//	p := &plugin.Plugin{
//		Name:    "networking",
//		Version: "1.0.0",
//		DesiredLRP: func(ctx context.Context, lrp *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
//			lrp.Properties["app_guid"] = lrp.GetLabels()["app_guid"]
//			return lrp, nil
//		},
//	}
//	err := p.Serve(ctx, "/var/run/gavel/networking.sock")
//
// GET /describe answers {"name","kinds","version"}; POST /transform/desired_lrp and POST
// /transform/task take the object's protojson and answer the whole (augmented) object with 200,
// or an error answer {"error","external","retriable"} built from the function's error (return
// an *Error to say whether the failure is the caller's fault and whether a retry can help).
//
// A plugin must be pure and deterministic: the same input gives the same output, with no
// timestamps, random values or dependence on external state (the host can check this by calling
// twice).
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Kinds of object a plugin transforms, as they appear in describe answers, configs and paths.
const (
	// KindDesiredLRP is a DesiredLRP, posted to PathDesiredLRP.
	KindDesiredLRP = "desired_lrp"
	// KindTask is a Task (guid, domain and definition), posted to PathTask.
	KindTask = "task"
)

// The routes of the contract.
const (
	// PathDescribe answers the plugin's Description (GET).
	PathDescribe = "/describe"
	// PathDesiredLRP transforms a DesiredLRP (POST).
	PathDesiredLRP = "/transform/" + KindDesiredLRP
	// PathTask transforms a Task (POST).
	PathTask = "/transform/" + KindTask
)

// MaxBodyBytes bounds a request or answer body (16 MiB, the BBS's largest gRPC message).
const MaxBodyBytes = 16 << 20

// Description is the answer to GET /describe.
type Description struct {
	// Name is the plugin's name, a DNS subdomain; it must equal the name the host configured.
	Name string `json:"name"`
	// Kinds are the kinds the plugin transforms ("desired_lrp", "task").
	Kinds []string `json:"kinds"`
	// Version is the plugin's version, for logs.
	Version string `json:"version,omitempty"`
}

// Error is a failure a transform function returns to say whose fault it is. Its JSON form is
// the error answer {"error","external","retriable"}.
type Error struct {
	// Message says what went wrong.
	Message string `json:"error"`
	// External means the caller's object is at fault (the host answers InvalidArgument).
	External bool `json:"external"`
	// Retriable means the same call may succeed later (the host answers Unavailable).
	Retriable bool `json:"retriable"`
}

// Error implements error.
func (e *Error) Error() string { return e.Message }

// Status is the HTTP status of the error answer: 422 for external errors, 503 for retriable
// ones, 500 otherwise. The host classifies by the body's flags; the status is for humans and
// proxies.
func (e *Error) Status() int {
	switch {
	case e.External:
		return http.StatusUnprocessableEntity
	case e.Retriable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Plugin is a transformer: a name and a function per kind. A nil function means the plugin
// does not transform that kind (it is not listed by describe and its route answers 404).
type Plugin struct {
	// Name is the plugin's DNS-subdomain name, answered by describe.
	Name string
	// Version is answered by describe.
	Version string
	// DesiredLRP transforms a desired LRP; it may modify and return its argument.
	DesiredLRP func(ctx context.Context, lrp *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error)
	// Task transforms a task (guid, domain and definition); it may modify and return its
	// argument.
	Task func(ctx context.Context, task *modelsv1.Task) (*modelsv1.Task, error)
}

// Describe is the plugin's description.
func (p *Plugin) Describe() Description {
	d := Description{Name: p.Name, Version: p.Version, Kinds: []string{}}
	if p.DesiredLRP != nil {
		d.Kinds = append(d.Kinds, KindDesiredLRP)
	}
	if p.Task != nil {
		d.Kinds = append(d.Kinds, KindTask)
	}
	return d
}

// Handler serves the contract's three routes.
func (p *Plugin) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathDescribe, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, p.Describe())
	})
	if p.DesiredLRP != nil {
		mux.HandleFunc("POST "+PathDesiredLRP, func(w http.ResponseWriter, r *http.Request) {
			serve(w, r, &modelsv1.DesiredLRP{}, p.DesiredLRP)
		})
	}
	if p.Task != nil {
		mux.HandleFunc("POST "+PathTask, func(w http.ResponseWriter, r *http.Request) {
			serve(w, r, &modelsv1.Task{}, p.Task)
		})
	}
	return mux
}

func serve[T proto.Message](w http.ResponseWriter, r *http.Request, in T, fn func(context.Context, T) (T, error)) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		writeError(w, &Error{Message: "read request: " + err.Error()})
		return
	}
	if err := protojson.Unmarshal(body, in); err != nil {
		writeError(w, &Error{Message: "parse request: " + err.Error()})
		return
	}
	out, err := fn(r.Context(), in)
	if err != nil {
		var pe *Error
		if !errors.As(err, &pe) {
			pe = &Error{Message: err.Error()}
		}
		writeError(w, pe)
		return
	}
	b, err := protojson.Marshal(out)
	if err != nil {
		writeError(w, &Error{Message: "encode answer: " + err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, e *Error) { writeJSON(w, e.Status(), e) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encode answer","external":false,"retriable":false}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// Listen removes a stale socket file at path, listens on it and makes it readable and writable
// by its owner only (a transformer socket is a local file with restrictive permissions).
func Listen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}

// Serve serves the plugin on the UNIX socket at path until ctx ends, then stops accepting,
// lets calls in flight finish (for up to 5 s) and removes the socket.
func (p *Plugin) Serve(ctx context.Context, path string) error {
	l, err := Listen(path)
	if err != nil {
		return err
	}
	return p.ServeListener(ctx, l)
}

// ServeListener serves the plugin on l until ctx ends (see Serve).
func (p *Plugin) ServeListener(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve plugin %s: %w", p.Name, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("stop plugin %s: %w", p.Name, err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve plugin %s: %w", p.Name, err)
	}
	return nil
}
