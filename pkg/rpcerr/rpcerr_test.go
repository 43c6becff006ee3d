package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestToStatus(t *testing.T) {
	inv := &InvalidError{}
	inv.Add("desired_lrp.process_guid", "must not be empty")
	inv.Add("desired_lrp.instances", "must be at most %d", 10)
	tests := []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"nil", nil, codes.OK, ""},
		{"not found wrapped", fmt.Errorf("claim web/0: %w", NotFound("actual lrp web/0")), codes.NotFound, "claim web/0: actual lrp web/0"},
		{"exists", AlreadyExists("desired lrp %q", "web"), codes.AlreadyExists, `desired lrp "web"`},
		{"precondition", FailedPrecondition("x"), codes.FailedPrecondition, "x"},
		{"aborted", Aborted("lost"), codes.Aborted, "lost"},
		{"unavailable", Unavailable("etcd down"), codes.Unavailable, "etcd down"},
		{"unavailable with retry", fmt.Errorf("desire web: %w", UnavailableRetry(time.Second, "etcd unreachable")), codes.Unavailable, "desire web: etcd unreachable"},
		{"indeterminate", fmt.Errorf("desire web: %w", Indeterminate("etcd did not answer")), codes.DeadlineExceeded, "desire web: etcd did not answer"},
		{"out of range", OutOfRange("compacted"), codes.OutOfRange, "compacted"},
		{"invalid", inv, codes.InvalidArgument, "invalid request: desired_lrp.process_guid: must not be empty; desired_lrp.instances: must be at most 10"},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded, "context deadline exceeded"},
		{"status passes", status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied, "no"},
		{"plain", errors.New("boom"), codes.Internal, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ToStatus(tt.err)
			st := status.Convert(err)
			if st.Code() != tt.code || (tt.err != nil && st.Message() != tt.msg) {
				t.Fatalf("got %v %q, want %v %q", st.Code(), st.Message(), tt.code, tt.msg)
			}
		})
	}
}

func TestInvalidDetails(t *testing.T) {
	err := ToStatus(Invalid("task.definition.rootfs", "must be a URI with a scheme"))
	st := status.Convert(err)
	if len(st.Details()) != 1 {
		t.Fatalf("details: %v", st.Details())
	}
	br := st.Details()[0].(*errdetails.BadRequest)
	if br.FieldViolations[0].Field != "task.definition.rootfs" {
		t.Fatalf("field: %v", br.FieldViolations[0])
	}
	if !errors.Is(Invalid("a", "b"), ErrInvalid) {
		t.Fatal("errors.Is ErrInvalid")
	}
	var e *InvalidError
	if e.Err() != nil || (&InvalidError{}).Err() != nil {
		t.Fatal("empty InvalidError must be nil")
	}
}

// TestUnavailableRetryDetails: the retry advice of UnavailableRetry survives wrapping and
// reaches the status as an errdetails.RetryInfo; a plain Unavailable carries none.
func TestUnavailableRetryDetails(t *testing.T) {
	st := status.Convert(ToStatus(fmt.Errorf("update web: %w", UnavailableRetry(1500*time.Millisecond, "etcd unreachable"))))
	if st.Code() != codes.Unavailable || len(st.Details()) != 1 {
		t.Fatalf("got %v with details %v", st.Code(), st.Details())
	}
	if d := st.Details()[0].(*errdetails.RetryInfo).GetRetryDelay().AsDuration(); d != 1500*time.Millisecond {
		t.Fatalf("retry delay %v", d)
	}
	if !errors.Is(UnavailableRetry(time.Second, "x"), ErrUnavailable) {
		t.Fatal("errors.Is ErrUnavailable")
	}
	if d := status.Convert(ToStatus(Unavailable("down"))).Details(); len(d) != 0 {
		t.Fatalf("plain Unavailable carries details %v", d)
	}
}

func TestOverloaded(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		want   time.Duration
		wantOK bool
	}{
		{name: "overloaded", err: Overloaded(150*time.Millisecond, "busy: %d in flight", 3), want: 150 * time.Millisecond, wantOK: true},
		{name: "wrapped", err: fmt.Errorf("claim: %w", Overloaded(time.Second, "busy")), want: time.Second, wantOK: true},
		{name: "plain resource exhausted", err: status.Error(codes.ResourceExhausted, "message too large")},
		{name: "other code", err: status.Error(codes.Unavailable, "down")},
		{name: "nil", err: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RetryAfter(tt.err)
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("RetryAfter = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
			if tt.wantOK && status.Code(errors.Unwrap(tt.err)) != codes.ResourceExhausted && status.Code(tt.err) != codes.ResourceExhausted {
				t.Fatalf("code of %v is not ResourceExhausted", tt.err)
			}
		})
	}
}
