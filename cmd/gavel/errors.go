package main

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exit codes: a script can tell what happened from them (README "CLI exit codes").
const (
	// exitOK: the command did what was asked (with --wait: every instance is RUNNING).
	exitOK = 0
	// exitError: any other failure (the BBS unreachable, an internal error, ...).
	exitError = 1
	// exitUsage: bad flags, arguments or input file, or the server refused the request as
	// invalid (InvalidArgument).
	exitUsage = 2
	// exitDenied: the server refused the caller (Unauthenticated or PermissionDenied).
	exitDenied = 3
	// exitNotFound: the object does not exist (NotFound).
	exitNotFound = 4
	// exitConflict: the object already exists, the state does not allow the change, or a
	// concurrent change won (AlreadyExists, FailedPrecondition, Aborted).
	exitConflict = 5
	// exitWaitTimeout: --wait gave up before every instance was RUNNING.
	exitWaitTimeout = 6
	// exitCellMismatch: --wait saw a CELL_MISMATCH placement error (no cell has the rootfs or
	// tags the work needs).
	exitCellMismatch = 7
	// exitInsufficientResources: --wait saw an INSUFFICIENT_RESOURCES placement error.
	exitInsufficientResources = 8
)

// exitError carries an exit code with the error shown to the user.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string { return e.err.Error() }
func (e *exitErr) Unwrap() error { return e.err }

// withExit attaches an exit code to err.
func withExit(code int, err error) error { return &exitErr{code: code, err: err} }

// usageErrorf is a usage error (exit code 2).
func usageErrorf(format string, args ...any) error {
	return withExit(exitUsage, fmt.Errorf(format, args...))
}

// exitCode maps an error to the process exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var e *exitErr
	if errors.As(err, &e) {
		return e.code
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.InvalidArgument, codes.OutOfRange:
			return exitUsage
		case codes.Unauthenticated, codes.PermissionDenied:
			return exitDenied
		case codes.NotFound:
			return exitNotFound
		case codes.AlreadyExists, codes.FailedPrecondition, codes.Aborted:
			return exitConflict
		}
	}
	return exitError
}

// humanError renders err for a person: a gRPC status becomes its code in words and message,
// followed by each field violation (BadRequest) and other details on its own line.
func humanError(err error) string {
	st, ok := status.FromError(unwrapStatus(err))
	if !ok || st.Code() == codes.OK {
		return err.Error()
	}
	var b strings.Builder
	prefix := strings.TrimSuffix(err.Error(), st.Err().Error())
	b.WriteString(prefix)
	switch st.Code() {
	case codes.InvalidArgument:
		b.WriteString("invalid request")
	case codes.Unauthenticated:
		b.WriteString("not authenticated")
	case codes.PermissionDenied:
		b.WriteString("permission denied")
	case codes.NotFound:
		b.WriteString("not found")
	case codes.AlreadyExists:
		b.WriteString("already exists")
	case codes.FailedPrecondition:
		b.WriteString("not allowed in the current state")
	case codes.Aborted:
		b.WriteString("a concurrent change won; retry")
	case codes.Unavailable:
		b.WriteString("unavailable (is the address right? a TLS server refuses --insecure, and a certificate it does not trust)")
	case codes.DeadlineExceeded:
		b.WriteString("timed out")
	default:
		b.WriteString(strings.ToLower(st.Code().String()))
	}
	var violations []*errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			violations = append(violations, br.GetFieldViolations()...)
		}
	}
	if len(violations) == 0 {
		b.WriteString(": ")
		b.WriteString(st.Message())
	}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				fmt.Fprintf(&b, "\n  %s: %s", v.GetField(), v.GetDescription())
			}
		case *errdetails.ErrorInfo:
			fmt.Fprintf(&b, "\n  reason: %s", d.GetReason())
		case *errdetails.PreconditionFailure:
			for _, v := range d.GetViolations() {
				fmt.Fprintf(&b, "\n  %s %s: %s", v.GetType(), v.GetSubject(), v.GetDescription())
			}
		}
	}
	return b.String()
}

// unwrapStatus finds a gRPC status error inside err's chain.
func unwrapStatus(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if _, ok := e.(interface{ GRPCStatus() *status.Status }); ok {
			return e
		}
	}
	return err
}
