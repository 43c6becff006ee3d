package transform

import (
	"fmt"

	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Class says why a plugin call failed; it picks the gRPC code and labels the error metric.
type Class string

// Classes of failure.
const (
	// ClassExternal: the plugin refused the object as the caller's fault (InvalidArgument).
	ClassExternal Class = "external"
	// ClassRetriable: the plugin failed and said a retry may succeed (Unavailable).
	ClassRetriable Class = "retriable"
	// ClassPlugin: the plugin failed and said neither (FailedPrecondition).
	ClassPlugin Class = "plugin"
	// ClassTimeout: the plugin did not answer within its timeout (Unavailable).
	ClassTimeout Class = "timeout"
	// ClassUnreachable: the socket could not be reached (Unavailable).
	ClassUnreachable Class = "unreachable"
	// ClassBadAnswer: the answer is not the contract's: bad status, invalid JSON, another kind
	// (Internal).
	ClassBadAnswer Class = "bad_answer"
	// ClassInvalidOutput: the answered object changed what it may not or fails model
	// validation (FailedPrecondition; the message names the field).
	ClassInvalidOutput Class = "invalid_output"
	// ClassNondeterministic: two calls with the same object gave different answers
	// (FailedPrecondition).
	ClassNondeterministic Class = "nondeterministic"
	// ClassDescribe: the describe answer was missing or wrong (Unavailable).
	ClassDescribe Class = "describe"
)

// Error is a failed plugin call. It unwraps to the pkg/rpcerr kind of its class, so
// rpcerr.ToStatus maps it to the gRPC code in one place.
type Error struct {
	// Plugin is the plugin's configured name.
	Plugin string
	// Socket is the plugin's socket path.
	Socket string
	// Kind is the kind of object being transformed.
	Kind string
	// Class says why the call failed.
	Class Class
	// Field is the first offending field for ClassInvalidOutput and ClassNondeterministic
	// (e.g. "desired_lrp.process_guid"), else empty.
	Field string
	// Message says what happened.
	Message string
}

// Error names the plugin, the kind and what went wrong.
func (e *Error) Error() string {
	return fmt.Sprintf("transformer %q (%s): %s", e.Plugin, e.Kind, e.Message)
}

// Unwrap returns the rpcerr kind of the class (nil for ClassBadAnswer: Internal).
func (e *Error) Unwrap() error {
	switch e.Class {
	case ClassExternal:
		inv := &rpcerr.InvalidError{}
		inv.Add(e.Kind, "transformer %q refused it: %s", e.Plugin, e.Message)
		return inv
	case ClassRetriable, ClassTimeout, ClassUnreachable, ClassDescribe:
		return rpcerr.ErrUnavailable
	case ClassPlugin, ClassInvalidOutput, ClassNondeterministic:
		return rpcerr.ErrFailedPrecondition
	}
	return nil
}
