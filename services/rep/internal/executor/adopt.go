package executor

import "context"

// Adopter is a Backend whose containers outlive the rep (oci: containerd's shims hold them).
// A restarted rep calls Adopt once, before it takes any work.
type Adopter interface {
	// Adopt takes over the containers an earlier run of the rep left, running or ended while
	// no rep watched them (their end is then reported as usual), and removes what that run
	// left that cannot be taken over (a container without its record, a half-created one,
	// its network attachment, mounts and directory). logFor gives the log sink of an adopted
	// container from its recorded spec (nil discards its output). Failing to adopt one
	// container removes it and is logged, not returned; the error is for a backend that cannot
	// list its containers at all.
	Adopt(ctx context.Context, logFor func(Spec) LogSink) ([]Adopted, error)
}

// Adopted is a container a restarted rep took over.
type Adopted struct {
	// Spec is the spec the container was started with, as the backend recorded it: no Env,
	// Files or Log.
	Spec Spec
	// Container is the running (or just ended) container.
	Container Container
}
