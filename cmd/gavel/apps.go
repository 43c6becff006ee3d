package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// appsCommand runs `gavel apps`. With instances (-o wide) each app's row gains its running
// version's instances' CPU, memory and disk, as cf app shows them: index 0 on the app's row,
// the others on rows of their own below it.
func appsCommand(ctx context.Context, c nsyncv1.NsyncServiceClient, args []string, out io.Writer, instances func(processGuid string) []*repv1.ContainerMetrics) error {
	fs := flag.NewFlagSet("apps", flag.ContinueOnError)
	space := fs.String("space", "", "only apps of this space")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	resp, err := c.Apps(ctx, &nsyncv1.AppsRequest{SpaceGuid: *space, Guids: fs.Args()})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, resp, true)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := "GUID\tNAME\tSPACE\tVERSION\tSTATE\tRUNNING\tCRASHED\tPLACEMENT\tNOTE"
	if instances != nil {
		header = "GUID\tNAME\tSPACE\tVERSION\tSTATE\tRUNNING\tCRASHED\tPLACEMENT\tINSTANCE\tCPU\tMEMORY\tDISK\tNOTE"
	}
	fmt.Fprintln(w, header)
	for _, a := range resp.GetApps() {
		state := strings.TrimPrefix(a.GetState().String(), "APP_STATE_")
		placement := "anywhere"
		if pc := a.GetPlacementConstraint(); len(pc.GetRequire())+len(pc.GetDisallow()) > 0 {
			placement = fmt.Sprintf("require %v disallow %v", pc.GetRequire(), pc.GetDisallow())
		}
		running, crashed := fmt.Sprint(a.GetRunning()), fmt.Sprint(a.GetCrashed())
		var notes []string
		if a.GetCountsUnknown() {
			running, crashed = "?", "?"
			notes = append(notes, "instance counts unknown: the BBS is unreachable")
		}
		if a.GetRestartToApply() {
			notes = append(notes, "pool changed: restart to apply")
		}
		if a.GetPendingVersion() != 0 {
			notes = append(notes, fmt.Sprintf("restarting to v%d", a.GetPendingVersion()))
		}
		if d := a.GetDeployment(); d != nil {
			notes = append(notes, fmt.Sprintf("%s v%d→v%d %s: %d/%d new healthy, %d old left", d.GetId(), d.GetFromVersion(), d.GetToVersion(),
				strings.ToLower(strings.TrimPrefix(d.GetState().String(), "DEPLOYMENT_STATE_")), d.GetNewHealthy(), d.GetNewDesired(), d.GetOldLeft()))
		}
		if pe := a.GetPlacementError(); pe.GetMessage() != "" {
			notes = append(notes, strings.TrimPrefix(pe.GetCode().String(), "CODE_")+": "+pe.GetMessage())
		}
		row := fmt.Sprintf("%s\t%s\t%s\tv%d\t%s\t%s/%d\t%s\t%s", a.GetApp().GetGuid(), a.GetApp().GetName(), a.GetApp().GetSpaceGuid(),
			a.GetApp().GetVersion(), state, running, a.GetDesired(), crashed, placement)
		if instances == nil {
			fmt.Fprintf(w, "%s\t%s\n", row, strings.Join(notes, "; "))
			continue
		}
		var ms []*repv1.ContainerMetrics
		if a.GetProcessGuid() != "" {
			ms = instances(a.GetProcessGuid())
		}
		if len(ms) == 0 {
			fmt.Fprintf(w, "%s\t-\t\t\t\t%s\n", row, strings.Join(notes, "; "))
			continue
		}
		for i, m := range ms {
			cpu, mem, disk := metricsColumns(m)
			if i > 0 {
				row = "\t\t\t\t\t\t\t"
			}
			note := ""
			if i == 0 {
				note = strings.Join(notes, "; ")
			}
			fmt.Fprintf(w, "%s\t#%d %s\t%s\t%s\t%s\t%s\n", row, m.GetIndex(), m.GetState(), cpu, mem, disk, note)
		}
	}
	return w.Flush()
}

// appCommand runs `gavel app push|scale|restart|stop|task|deployments|promote|cancel|rollback|versions`;
// progress of --wait goes to errOut.
func appCommand(ctx context.Context, c nsyncv1.NsyncServiceClient, args []string, out, errOut io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: gavel app push|scale|restart|stop|task|deployments|promote|cancel|rollback|versions ...")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("app "+sub, flag.ContinueOnError)
	del := fs.Bool("delete", false, "stop: forget the app as well")
	strategy := fs.String("strategy", "", "push/rollback: rolling (default), canary or recreate")
	maxInFlight := fs.Int("max-in-flight", 0, "push/rollback: new instances started before old ones stop (default 1)")
	canaries := fs.Int("canaries", 0, "push: canaries of a canary deployment (default 1)")
	minHealthy := fs.Duration("min-healthy-time", 0, "push/rollback: how long new instances stay ready before old ones go")
	deadline := fs.Duration("progress-deadline", 0, "push/rollback: how long without progress before the deployment fails (default nsync's)")
	noRevert := fs.Bool("no-auto-revert", false, "push/rollback: do not revert a failed deployment")
	version := fs.Int64("version", 0, "rollback: the version to roll back to (default the last healthy one before the serving one)")
	wait := fs.Bool("wait", false, "push/rollback/promote/cancel: follow the deployment to its end, printing progress")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long --wait waits")
	if err := fs.Parse(args); err != nil {
		return err
	}
	args = fs.Args()
	opts := func() (*nsyncv1.DeploymentOptions, error) {
		o := &nsyncv1.DeploymentOptions{MaxInFlight: int32(*maxInFlight), Canaries: int32(*canaries),
			MinHealthyTimeMs: minHealthy.Milliseconds(), ProgressDeadlineMs: deadline.Milliseconds(), NoAutoRevert: *noRevert}
		if *strategy == "" && *canaries > 0 {
			*strategy = "canary"
		}
		if *strategy != "" {
			v, ok := nsyncv1.DeploymentStrategy_value["DEPLOYMENT_STRATEGY_"+strings.ToUpper(*strategy)]
			if !ok || v == 0 {
				return nil, usageErrorf("--strategy: unknown strategy %q (rolling, canary, recreate)", *strategy)
			}
			o.Strategy = nsyncv1.DeploymentStrategy(v)
		}
		return o, nil
	}
	follow := func(guid string, d *nsyncv1.Deployment) error {
		if !*wait || d == nil {
			return nil
		}
		return followDeployment(ctx, c, guid, d.GetId(), *timeout, errOut)
	}
	switch sub {
	case "push":
		if len(args) != 1 {
			return errors.New("usage: gavel app push [--strategy S] [--max-in-flight N] [--canaries N] [--wait] FILE (YAML or JSON)")
		}
		app, err := readApp(args[0])
		if err != nil {
			return err
		}
		o, err := opts()
		if err != nil {
			return err
		}
		resp, err := c.DeployApp(ctx, &nsyncv1.DeployAppRequest{App: app, Options: o})
		if err != nil {
			return err
		}
		if err := printJSON(out, resp, true); err != nil {
			return err
		}
		return follow(app.GetGuid(), resp.GetDeployment())
	case "deployments":
		if len(args) != 1 {
			return errors.New("usage: gavel app deployments GUID")
		}
		resp, err := c.ListDeployments(ctx, &nsyncv1.ListDeploymentsRequest{AppGuid: args[0]})
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tFROM\tTO\tSTRATEGY\tSTATE\tNEW HEALTHY\tOLD LEFT\tMESSAGE")
		for _, d := range resp.GetDeployments() {
			strat := strings.ToLower(strings.TrimPrefix(d.GetOptions().GetStrategy().String(), "DEPLOYMENT_STRATEGY_"))
			if d.GetRevertOf() != "" {
				strat = "revert of " + d.GetRevertOf()
			}
			fmt.Fprintf(w, "%s\tv%d\tv%d\t%s\t%s\t%d/%d\t%d\t%s\n", d.GetId(), d.GetFromVersion(), d.GetToVersion(), strat,
				strings.TrimPrefix(d.GetState().String(), "DEPLOYMENT_STATE_"), d.GetNewHealthy(), d.GetNewDesired(), d.GetOldLeft(), d.GetMessage())
		}
		return w.Flush()
	case "versions":
		if len(args) != 1 {
			return errors.New("usage: gavel app versions GUID")
		}
		resp, err := c.AppVersions(ctx, &nsyncv1.AppVersionsRequest{AppGuid: args[0]})
		if err != nil {
			return err
		}
		return printJSON(out, resp, true)
	case "promote", "cancel":
		if len(args) != 1 {
			return fmt.Errorf("usage: gavel app %s [--wait] GUID", sub)
		}
		var d *nsyncv1.Deployment
		if sub == "promote" {
			resp, err := c.PromoteDeployment(ctx, &nsyncv1.PromoteDeploymentRequest{AppGuid: args[0]})
			if err != nil {
				return err
			}
			d = resp.GetDeployment()
		} else {
			resp, err := c.CancelDeployment(ctx, &nsyncv1.CancelDeploymentRequest{AppGuid: args[0]})
			if err != nil {
				return err
			}
			d = resp.GetDeployment()
		}
		fmt.Fprintf(out, "deployment %s: %s requested\n", d.GetId(), sub)
		if sub == "cancel" && *wait {
			// A cancel ends in CANCELLED by design: follow the revert that takes its place.
			err := followDeployment(ctx, c, args[0], d.GetId(), *timeout, errOut)
			var ee *exitErr
			if errors.As(err, &ee) && ee.code == exitConflict {
				return nil
			}
			return err
		}
		return follow(args[0], d)
	case "rollback":
		if len(args) != 1 {
			return errors.New("usage: gavel app rollback [--version N] [--wait] GUID")
		}
		o, err := opts()
		if err != nil {
			return err
		}
		resp, err := c.RollbackApp(ctx, &nsyncv1.RollbackAppRequest{AppGuid: args[0], Version: *version, Options: o})
		if err != nil {
			return err
		}
		if err := printJSON(out, resp, true); err != nil {
			return err
		}
		return follow(args[0], resp.GetDeployment())
	case "scale":
		if len(args) != 2 {
			return errors.New("usage: gavel app scale GUID INSTANCES")
		}
		n, err := strconv.ParseInt(args[1], 10, 32)
		if err != nil {
			return fmt.Errorf("instances: %w", err)
		}
		n32 := int32(n)
		resp, err := c.UpdateApp(ctx, &nsyncv1.UpdateAppRequest{Guid: args[0], Instances: &n32})
		if err != nil {
			return err
		}
		return printJSON(out, resp, true)
	case "restart":
		if len(args) != 1 {
			return errors.New("usage: gavel app restart GUID")
		}
		resp, err := c.RestartApp(ctx, &nsyncv1.RestartAppRequest{Guid: args[0]})
		if err != nil {
			return err
		}
		return printJSON(out, resp, true)
	case "stop":
		if len(args) != 1 {
			return errors.New("usage: gavel app stop [-delete] GUID")
		}
		if _, err := c.StopApp(ctx, &nsyncv1.StopAppRequest{Guid: args[0], Delete: *del}); err != nil {
			return err
		}
		fmt.Fprintf(out, "app %s stopped\n", args[0])
		return nil
	case "task":
		if len(args) < 2 {
			return errors.New("usage: gavel app task GUID COMMAND...")
		}
		resp, err := c.RunTask(ctx, &nsyncv1.RunTaskRequest{AppGuid: args[0], Command: strings.Join(args[1:], " ")})
		if err != nil {
			return err
		}
		return printJSON(out, resp, true)
	}
	return fmt.Errorf("unknown app command %q (push, scale, restart, stop, task, deployments, promote, cancel, rollback, versions)", sub)
}

// readApp reads an app from a YAML or JSON file (JSON is YAML); field names are the protojson
// ones (lowerCamel or the proto's snake_case), routes the cf-router document as is.
func readApp(path string) (*nsyncv1.App, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	app := &nsyncv1.App{}
	if err := protojson.Unmarshal(j, app); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return app, nil
}

// printJSON prints one nsync answer as protojson (indented when indent is set).
func printJSON(out io.Writer, m proto.Message, indent bool) error {
	opts := protojson.MarshalOptions{}
	if indent {
		opts.Multiline, opts.Indent = true, "  "
	}
	b, err := opts.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(b))
	return err
}

// followDeployment polls app guid's deployment id until it ends (and, when it failed or was
// cancelled, until the revert that follows it ends), printing a progress line — new healthy,
// old left — on every change to errOut. The exit code says how it ended: 0 succeeded (or a
// canary paused, waiting for promote or cancel), 7 CELL_MISMATCH, 8 INSUFFICIENT_RESOURCES,
// 5 cancelled, 6 --timeout, 1 any other failure.
func followDeployment(ctx context.Context, c nsyncv1.NsyncServiceClient, guid, id string, timeout time.Duration, errOut io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	var failed *nsyncv1.Deployment
	for {
		resp, err := c.ListDeployments(ctx, &nsyncv1.ListDeploymentsRequest{AppGuid: guid})
		if ctx.Err() != nil {
			return withExit(exitWaitTimeout, fmt.Errorf("deployment %s: not over within %s (%s)", id, timeout, last))
		}
		if err != nil {
			return err
		}
		var d, revert *nsyncv1.Deployment
		for _, x := range resp.GetDeployments() {
			switch {
			case x.GetId() == id:
				d = x
			case x.GetRevertOf() == id:
				revert = x
			}
		}
		if d == nil {
			return fmt.Errorf("deployment %s of app %s not found", id, guid)
		}
		shown := d
		if revert != nil {
			shown = revert
		}
		line := fmt.Sprintf("%s v%d→v%d %s: %d/%d new healthy, %d old left", shown.GetId(), shown.GetFromVersion(), shown.GetToVersion(),
			strings.TrimPrefix(shown.GetState().String(), "DEPLOYMENT_STATE_"), shown.GetNewHealthy(), max(shown.GetNewDesired(), 0), shown.GetOldLeft())
		if m := shown.GetMessage(); m != "" {
			line += " (" + m + ")"
		}
		if line != last {
			fmt.Fprintln(errOut, line)
			last = line
		}
		switch d.GetState() {
		case nsyncv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED, nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED:
			return nil
		case nsyncv1.DeploymentState_DEPLOYMENT_STATE_FAILED, nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED:
			failed = d
		}
		if failed != nil && (revert == nil || (revert.GetState() != nsyncv1.DeploymentState_DEPLOYMENT_STATE_RUNNING && revert.GetState() != nsyncv1.DeploymentState_DEPLOYMENT_STATE_PAUSED)) {
			msg := fmt.Errorf("deployment %s %s: %s", id, strings.ToLower(strings.TrimPrefix(failed.GetState().String(), "DEPLOYMENT_STATE_")), failed.GetMessage())
			if revert != nil {
				msg = fmt.Errorf("%w; revert %s %s", msg, revert.GetId(), strings.ToLower(strings.TrimPrefix(revert.GetState().String(), "DEPLOYMENT_STATE_")))
			}
			switch {
			case failed.GetState() == nsyncv1.DeploymentState_DEPLOYMENT_STATE_CANCELLED:
				return withExit(exitConflict, msg)
			case failed.GetPlacementError().GetCode() == modelsv1.PlacementError_CODE_CELL_MISMATCH:
				return withExit(exitCellMismatch, msg)
			case failed.GetPlacementError().GetCode() == modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES:
				return withExit(exitInsufficientResources, msg)
			}
			return withExit(exitError, msg)
		}
		select {
		case <-ctx.Done():
		case <-time.After(waitPoll):
		}
	}
}
