package console

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
)

// restartWait is how long the console waits on a restart before it answers: a refusal (a
// read-only identity, an app already restarting) comes at once and is shown; a restart that
// is under way goes on at nsync, and the apps page shows its pending version.
const restartWait = 3 * time.Second

// restartLimit bounds a restart the console started (nsync's own restart timeout is shorter).
const restartLimit = 15 * time.Minute

// appView is one nsync app on the apps page.
type appView struct {
	Guid, Name, Space, Stack string
	State                    string
	Version, Pending         int64
	ProcessGuid              string
	Desired, Running         int32
	Crashed                  int32
	CountsUnknown            bool
	RestartToApply           bool
	Placement, Message       string
	Reasons                  []string
	Pool                     string
}

// appsPage lists nsync's apps: state, version, instances running of desired, the last placement
// error in words with its per-reason cell counts, and whether a restart would apply a changed
// pool.
func (s *Server) appsPage(ctx context.Context) ([]appView, error) {
	if s.cfg.Nsync == nil {
		return nil, fmt.Errorf("no nsync address: start the console with --nsync ADDR")
	}
	resp, err := s.cfg.Nsync.Apps(ctx, &nsyncv1.AppsRequest{})
	if err != nil {
		return nil, fmt.Errorf("nsync apps: %w", err)
	}
	var out []appView
	for _, a := range resp.GetApps() {
		app := a.GetApp()
		v := appView{Guid: app.GetGuid(), Name: app.GetName(), Space: app.GetSpaceGuid(), Stack: orDash(app.GetStack()),
			State: strings.ToLower(strings.TrimPrefix(a.GetState().String(), "APP_STATE_")), Version: app.GetVersion(),
			Pending: a.GetPendingVersion(), ProcessGuid: a.GetProcessGuid(), Desired: a.GetDesired(), Running: a.GetRunning(),
			Crashed: a.GetCrashed(), CountsUnknown: a.GetCountsUnknown(), RestartToApply: a.GetRestartToApply()}
		if app.GetDockerImage() != "" {
			v.Stack = "docker " + app.GetDockerImage()
		}
		if pe := a.GetPlacementError(); pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED {
			v.Placement, v.Message, v.Reasons = codeWords(pe.GetCode()), pe.GetMessage(), reasons(pe.GetMessage())
		}
		if pc := a.GetPlacementConstraint(); pc != nil {
			v.Pool = strings.TrimSpace(fmt.Sprintf("%s %s", prefixed("requires ", pc.GetRequire()), prefixed("disallows ", pc.GetDisallow())))
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Guid < out[j].Guid })
	return out, nil
}

// prefixed is "prefix a, b" for a non-empty list, "" otherwise.
func prefixed(prefix string, tags []string) string {
	if len(tags) == 0 {
		return ""
	}
	return prefix + strings.Join(tags, ", ")
}

// restart asks nsync to restart app guid with the caller's certificate and waits restartWait
// for its answer: the error when nsync refused or failed by then, nil once it is under way
// (it goes on in the background, to restartLimit) or done.
func (s *Server) restart(guid string) (done string, err error) {
	if s.cfg.Nsync == nil {
		return "", fmt.Errorf("no nsync address: start the console with --nsync ADDR")
	}
	answer := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), restartLimit)
		defer cancel()
		resp, err := s.cfg.Nsync.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: guid})
		s.cfg.Logger.Info("restart finished", "app_guid", guid, "process_guid", resp.GetProcessGuid(), "identity", s.cfg.Identity, "error", err)
		answer <- err
	}()
	select {
	case err := <-answer:
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("app %s restarted", guid), nil
	case <-time.After(restartWait):
		return fmt.Sprintf("restart of app %s under way: its next version starts, then takes the routes (see its pending version)", guid), nil
	}
}
