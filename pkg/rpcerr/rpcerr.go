// Package rpcerr is the one place where Gavel's domain errors become gRPC status codes.
//
// Domain code returns errors built here (NotFound, AlreadyExists, FailedPrecondition, Aborted,
// Unavailable, or an *InvalidError listing field violations) and wraps them with context as it
// likes; ToStatus, applied by the interceptors of this package, maps them to gRPC statuses with
// the whole message, so handlers stay thin.
package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Kinds of domain error; test for them with errors.Is.
var (
	// ErrNotFound means the named record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists means a record with the same identity exists.
	ErrAlreadyExists = errors.New("already exists")
	// ErrFailedPrecondition means the record is not in a state that allows the change.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrAborted means a compare-and-swap was lost; the caller may retry.
	ErrAborted = errors.New("aborted")
	// ErrUnavailable means a dependency (etcd, a peer) cannot be reached.
	ErrUnavailable = errors.New("unavailable")
	// ErrInvalid means the request is malformed; see *InvalidError for the fields.
	ErrInvalid = errors.New("invalid argument")
	// ErrOutOfRange means a requested revision is no longer available.
	ErrOutOfRange = errors.New("out of range")
)

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

func newKind(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// NotFound builds an ErrNotFound error with a message.
func NotFound(format string, args ...any) error { return newKind(ErrNotFound, format, args...) }

// AlreadyExists builds an ErrAlreadyExists error with a message.
func AlreadyExists(format string, args ...any) error {
	return newKind(ErrAlreadyExists, format, args...)
}

// FailedPrecondition builds an ErrFailedPrecondition error with a message.
func FailedPrecondition(format string, args ...any) error {
	return newKind(ErrFailedPrecondition, format, args...)
}

// Aborted builds an ErrAborted error with a message.
func Aborted(format string, args ...any) error { return newKind(ErrAborted, format, args...) }

// Unavailable builds an ErrUnavailable error with a message.
func Unavailable(format string, args ...any) error {
	return newKind(ErrUnavailable, format, args...)
}

// OutOfRange builds an ErrOutOfRange error with a message.
func OutOfRange(format string, args ...any) error { return newKind(ErrOutOfRange, format, args...) }

// Violation is one invalid field of a request.
type Violation struct {
	// Field is the dotted path of the field, e.g. "desired_lrp.process_guid".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// InvalidError collects the field violations of one request.
type InvalidError struct {
	// Violations are the invalid fields, in the order found.
	Violations []Violation
}

// Add records a violation of field.
func (e *InvalidError) Add(field, format string, args ...any) {
	e.Violations = append(e.Violations, Violation{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// Merge adds the violations of another error, which may be nil or any error (a non-InvalidError
// is recorded under field).
func (e *InvalidError) Merge(field string, err error) {
	if err == nil {
		return
	}
	var inv *InvalidError
	if errors.As(err, &inv) {
		e.Violations = append(e.Violations, inv.Violations...)
		return
	}
	e.Add(field, "%s", err.Error())
}

// Err returns e when it holds violations and nil otherwise.
func (e *InvalidError) Err() error {
	if e == nil || len(e.Violations) == 0 {
		return nil
	}
	return e
}

// Error lists every violation as "field: reason".
func (e *InvalidError) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Reason
	}
	return "invalid request: " + strings.Join(parts, "; ")
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Invalid builds an InvalidError with one violation.
func Invalid(field, format string, args ...any) error {
	e := &InvalidError{}
	e.Add(field, format, args...)
	return e
}

// Code returns the gRPC code err maps to.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	switch {
	case errors.Is(err, ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, ErrNotFound):
		return codes.NotFound
	case errors.Is(err, ErrAlreadyExists):
		return codes.AlreadyExists
	case errors.Is(err, ErrFailedPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, ErrAborted):
		return codes.Aborted
	case errors.Is(err, ErrOutOfRange), errors.Is(err, rpctypes.ErrCompacted), errors.Is(err, rpctypes.ErrGRPCCompacted):
		return codes.OutOfRange
	case errors.Is(err, ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	// etcd client errors carry a gRPC status somewhere in their chain.
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		switch c := se.GRPCStatus().Code(); c {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			return c
		}
	}
	if errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrGRPCNoLeader) ||
		errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrGRPCTimeout) {
		return codes.Unavailable
	}
	return codes.Internal
}

// ToStatus converts err to a gRPC status error: statuses pass through, domain errors get their
// code and full message, field violations are attached as errdetails.BadRequest.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	st := status.New(Code(err), err.Error())
	var inv *InvalidError
	if errors.As(err, &inv) {
		br := &errdetails.BadRequest{}
		for _, v := range inv.Violations {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Reason})
		}
		if withDetails, derr := st.WithDetails(br); derr == nil {
			st = withDetails
		}
	}
	return st.Err()
}

// UnaryServerInterceptor maps handler errors with ToStatus.
func UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		return resp, ToStatus(err)
	}
}

// StreamServerInterceptor maps stream handler errors with ToStatus.
func StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return ToStatus(handler(srv, ss))
	}
}
