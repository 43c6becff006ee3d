package authz

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Metadata keys a proxying service (the BBS) sets on the calls it makes for a user, so that
// the server behind it (the rep) checks the user's role again.
const (
	// UserIdentityKey carries the user's certificate identity.
	UserIdentityKey = "gavel-user-identity"
	// UserRoleKey carries the user's role ("admin", "read-only", ...).
	UserRoleKey = "gavel-user-role"
)

// OnBehalfOf returns ctx with the caller of the call being served (CallerFrom) as outgoing
// metadata, for a call made for that user. A plaintext caller adds nothing.
func OnBehalfOf(ctx context.Context) context.Context {
	c, ok := CallerFrom(ctx)
	if !ok || c.Unenforced {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, UserIdentityKey, c.Identity, UserRoleKey, c.Role.String())
}

// UserRecheck is a stream and unary interceptor pair that checks again, for the methods it
// lists (short names of service), the role of the user a proxy called for: a caller of role
// proxy must say whose call it makes (OnBehalfOf) and that user's role must be one listed for
// the method; admin callers and plaintext calls pass. Refusals are PermissionDenied and written
// to audit.
type UserRecheck struct {
	// Service is the full service name, e.g. "gavel.rep.v1.RepService".
	Service string
	// Proxy is the role kind that calls for users, e.g. BBS.
	Proxy string
	// Users maps a method to the user role kinds it is for.
	Users map[string][]string
	// Audit receives a line per refusal.
	Audit interface {
		Warn(msg string, args ...interface{})
	}
}

// check decides one call of method (a full gRPC method name).
func (u UserRecheck) check(ctx context.Context, method string) error {
	svc, name, _ := splitMethod(method)
	roles, listed := u.Users[name]
	if svc != u.Service || !listed {
		return nil
	}
	c, ok := CallerFrom(ctx)
	if !ok || c.Unenforced || c.Role.Kind == Admin || c.Role.Kind != u.Proxy {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	identity, role := first(md.Get(UserIdentityKey)), first(md.Get(UserRoleKey))
	kind, _, _ := strings.Cut(role, "/")
	if role == "" || !contains(roles, kind) {
		err := fmt.Errorf("%s may be called for %v only; %s called it for %q (role %q)", name, roles, c.Identity, identity, role)
		if u.Audit != nil {
			u.Audit.Warn("refused", "identity", c.Identity, "role", c.Role.String(), "call", method, "user", identity, "user_role", role, "reason", err.Error())
		}
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

// Unary is the unary server interceptor; install it after the Authorizer's.
func (u UserRecheck) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := u.check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream is the stream server interceptor; install it after the Authorizer's.
func (u UserRecheck) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := u.check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
