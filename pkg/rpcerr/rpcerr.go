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
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
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
	// ErrUnavailable means a dependency (etcd, a peer) cannot be reached. A change answered
	// with it was not made and never will be: the caller may send it again.
	ErrUnavailable = errors.New("unavailable")
	// ErrIndeterminate means the outcome of a change is unknown: it was sent to etcd, and the
	// answer was lost (etcd went away, or the bound on the call ran out). The change may have
	// been made, or may still be made by a transaction already in etcd's log; the caller reads
	// the record back, or sends the change again where doing so is safe (a repeated DesireLRP
	// answers AlreadyExists). It maps to DeadlineExceeded, the code gRPC defines for exactly
	// this case ("the operation may have completed successfully").
	ErrIndeterminate = errors.New("outcome unknown")
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

// UnavailableRetry builds an ErrUnavailable error that also tells the caller how long to wait
// before trying again; ToStatus attaches the wait as an errdetails.RetryInfo.
func UnavailableRetry(retryAfter time.Duration, format string, args ...any) error {
	return &retryError{kindError: kindError{kind: ErrUnavailable, msg: fmt.Sprintf(format, args...)}, after: retryAfter}
}

// retryError is a kindError carrying a retry-after.
type retryError struct {
	kindError
	after time.Duration
}

// Indeterminate builds an ErrIndeterminate error with a message.
func Indeterminate(format string, args ...any) error {
	return newKind(ErrIndeterminate, format, args...)
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
//
// Domain errors come first, wherever they sit in the chain. A gRPC status that is err itself
// (not wrapped) is Gavel's own answer (an authorization refusal, a validator) and keeps its code.
// Anything else that carries a gRPC status — an etcd client error, a failed call to a peer — is
// a storage or transport failure, never passed through as if it were Gavel's: a failure a retry
// can help with is Unavailable, any other is Internal. An expired etcd lease is therefore
// Internal, not NotFound.
func Code(err error) codes.Code {
	code, _ := classify(err)
	return code
}

// IsBackendFailure reports whether err is a storage or transport failure (etcd, a peer)
// rather than a domain error or Gavel's own status; its cause deserves a log line.
func IsBackendFailure(err error) bool {
	_, backend := classify(err)
	return backend
}

func classify(err error) (codes.Code, bool) {
	if err == nil {
		return codes.OK, false
	}
	switch {
	case errors.Is(err, ErrInvalid):
		return codes.InvalidArgument, false
	case errors.Is(err, ErrNotFound):
		return codes.NotFound, false
	case errors.Is(err, ErrAlreadyExists):
		return codes.AlreadyExists, false
	case errors.Is(err, ErrFailedPrecondition):
		return codes.FailedPrecondition, false
	case errors.Is(err, ErrAborted):
		return codes.Aborted, false
	case errors.Is(err, ErrOutOfRange), errors.Is(err, rpctypes.ErrCompacted), errors.Is(err, rpctypes.ErrGRPCCompacted):
		return codes.OutOfRange, false
	case errors.Is(err, ErrUnavailable):
		return codes.Unavailable, false
	case errors.Is(err, ErrIndeterminate):
		return codes.DeadlineExceeded, false
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, false
	case errors.Is(err, context.Canceled):
		return codes.Canceled, false
	}
	if s, ok := err.(interface{ GRPCStatus() *status.Status }); ok && !isEtcdStatus(s.GRPCStatus()) {
		return s.GRPCStatus().Code(), false
	}
	if c, ok := backendCode(err); ok {
		if retriable(c) || errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrGRPCNoLeader) ||
			errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrGRPCTimeout) {
			return codes.Unavailable, true
		}
		return codes.Internal, true
	}
	return codes.Internal, false
}

// backendCode finds the gRPC code of an etcd client error or a peer's status in err's chain.
func backendCode(err error) (codes.Code, bool) {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code(), true
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code(), true
	}
	return codes.Unknown, false
}

// retriable codes of a storage or transport failure: the same call may succeed later.
func retriable(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

// isEtcdStatus reports whether st is one of etcd's own statuses (their messages start with
// "etcdserver: " or "etcdclient: ").
func isEtcdStatus(st *status.Status) bool {
	m := st.Message()
	return strings.HasPrefix(m, "etcdserver: ") || strings.HasPrefix(m, "etcdclient: ")
}

// ToStatus converts err to a gRPC status error: Gavel's own statuses pass through, domain
// errors get their code and full message, storage and transport failures become Unavailable
// or Internal (see Code), field violations are attached as errdetails.BadRequest.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	code := Code(err)
	if s, ok := err.(interface{ GRPCStatus() *status.Status }); ok && s.GRPCStatus().Code() == code {
		return err
	}
	st := status.New(code, err.Error())
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
	var re *retryError
	if errors.As(err, &re) {
		if withDetails, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(re.after)}); derr == nil {
			st = withDetails
		}
	}
	return st.Err()
}

// Option configures the interceptors.
type Option func(*options)

type options struct{ log hclog.Logger }

// WithLogger logs the cause of every storage or transport failure the interceptors map.
func WithLogger(l hclog.Logger) Option { return func(o *options) { o.log = l } }

func newOptions(opts []Option) options {
	o := options{log: hclog.NewNullLogger()}
	for _, f := range opts {
		f(&o)
	}
	return o
}

func (o options) toStatus(method string, err error) error {
	if IsBackendFailure(err) {
		o.log.Error("storage or transport failure", "grpc.method", method, "code", Code(err).String(), "error", err)
	}
	return ToStatus(err)
}

// UnaryServerInterceptor maps handler errors with ToStatus.
func UnaryServerInterceptor(opts ...Option) grpc.UnaryServerInterceptor {
	o := newOptions(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		return resp, o.toStatus(info.FullMethod, err)
	}
}

// StreamServerInterceptor maps stream handler errors with ToStatus.
func StreamServerInterceptor(opts ...Option) grpc.StreamServerInterceptor {
	o := newOptions(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return o.toStatus(info.FullMethod, handler(srv, ss))
	}
}
