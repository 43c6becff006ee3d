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

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
)

// appsCommand runs `gavel apps`.
func appsCommand(ctx context.Context, c nsyncv1.NsyncServiceClient, args []string, out io.Writer) error {
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
	fmt.Fprintln(w, "GUID\tNAME\tSPACE\tVERSION\tSTATE\tRUNNING\tCRASHED\tPLACEMENT\tNOTE")
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
		if pe := a.GetPlacementError(); pe.GetMessage() != "" {
			notes = append(notes, strings.TrimPrefix(pe.GetCode().String(), "CODE_")+": "+pe.GetMessage())
		}
		fmt.Fprintf(w, "%s\t%s\t%s\tv%d\t%s\t%s/%d\t%s\t%s\t%s\n", a.GetApp().GetGuid(), a.GetApp().GetName(), a.GetApp().GetSpaceGuid(),
			a.GetApp().GetVersion(), state, running, a.GetDesired(), crashed, placement, strings.Join(notes, "; "))
	}
	return w.Flush()
}

// appCommand runs `gavel app push|scale|restart|stop|task`.
func appCommand(ctx context.Context, c nsyncv1.NsyncServiceClient, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: gavel app push|scale|restart|stop|task ...")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("app "+sub, flag.ContinueOnError)
	del := fs.Bool("delete", false, "stop: forget the app as well")
	if err := fs.Parse(args); err != nil {
		return err
	}
	args = fs.Args()
	switch sub {
	case "push":
		if len(args) != 1 {
			return errors.New("usage: gavel app push FILE (YAML or JSON)")
		}
		app, err := readApp(args[0])
		if err != nil {
			return err
		}
		resp, err := c.DesireApp(ctx, &nsyncv1.DesireAppRequest{App: app})
		if err != nil {
			return err
		}
		return printJSON(out, resp, true)
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
	return fmt.Errorf("unknown app command %q (push, scale, restart, stop, task)", sub)
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
