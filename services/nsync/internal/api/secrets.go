package api

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/pkg/authz"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/services/nsync/internal/build"
)

// Secret env values in answers (docs/decisions/0021): an app's env entries named by
// secret_env are answered as "<redacted>" unless the caller holds the read-secrets capability
// (authz secret_readers; every caller over plaintext). A context the authorizer never saw is
// redacted (fail closed).

// mayReadSecrets reports whether ctx's caller may be answered secret values.
func mayReadSecrets(ctx context.Context) bool {
	c, ok := authz.CallerFrom(ctx)
	return ok && c.MaySeeSecrets()
}

// appFor is app as ctx's caller may see it.
func appFor(ctx context.Context, app *nsyncv1.App) *nsyncv1.App {
	if mayReadSecrets(ctx) {
		return app
	}
	return build.RedactApp(app)
}

// appInfosFor is infos as ctx's caller may see them, copying only the infos that change.
func appInfosFor(ctx context.Context, infos []*nsyncv1.AppInfo) []*nsyncv1.AppInfo {
	if mayReadSecrets(ctx) {
		return infos
	}
	for i, info := range infos {
		if r := build.RedactApp(info.GetApp()); r != info.GetApp() {
			c := proto.Clone(info).(*nsyncv1.AppInfo)
			c.App = r
			infos[i] = c
		}
	}
	return infos
}

// versionsFor is an app's version history as ctx's caller may see it, copying only the versions
// that change.
func versionsFor(ctx context.Context, vs []*nsyncv1.AppVersion) []*nsyncv1.AppVersion {
	if mayReadSecrets(ctx) {
		return vs
	}
	out := make([]*nsyncv1.AppVersion, len(vs))
	for i, v := range vs {
		out[i] = v
		if r := build.RedactApp(v.GetApp()); r != v.GetApp() {
			c := proto.Clone(v).(*nsyncv1.AppVersion)
			c.App = r
			out[i] = c
		}
	}
	return out
}
