package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// nsyncClient dials nsync at --nsync with the global TLS settings.
func (c *cli) nsyncClient() (nsyncv1.NsyncServiceClient, error) {
	conn, err := c.dial(c.nsync)
	if err != nil {
		return nil, err
	}
	return nsyncv1.NewNsyncServiceClient(conn), nil
}

// nsyncCommands are `gavel apps`, `gavel app push|scale|restart|stop|task` and `gavel pools ...`:
// thin cobra front ends over appsCommand, appCommand and poolsCommand (apps.go, pools.go), which
// talk to nsync.
func (c *cli) nsyncCommands() []*cobra.Command {
	// run calls one of the nsync command functions with the arguments it parses itself.
	run := func(fn func(nsyncv1.NsyncServiceClient, *cobra.Command, []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			ns, err := c.nsyncClient()
			if err != nil {
				return err
			}
			return fn(ns, cmd, args)
		}
	}
	var space string
	apps := &cobra.Command{
		Use:   "apps [GUID...]",
		Short: "List apps (nsync): version, state, running/desired, placement, restart-to-apply notes; -o wide adds each instance's CPU, memory and disk",
		RunE: run(func(ns nsyncv1.NsyncServiceClient, cmd *cobra.Command, args []string) error {
			p, err := c.printer()
			if err != nil {
				return err
			}
			flags := []string{"-space", space}
			var instances func(string) []*repv1.ContainerMetrics
			switch p.format {
			case formatJSON:
				flags = append(flags, "-json")
			case formatWide:
				bbs, err := c.bbsClient()
				if err != nil {
					return err
				}
				instances = func(guid string) []*repv1.ContainerMetrics { return lrpMetrics(cmd.Context(), bbs, guid) }
			case formatTable:
			default:
				return usageErrorf("apps prints a table, -o wide or -o json")
			}
			return appsCommand(cmd.Context(), ns, append(flags, args...), c.out, instances)
		}),
	}
	apps.Flags().StringVar(&space, "space", "", "only apps of this space")

	app := &cobra.Command{Use: "app", Short: "Push, scale, restart, stop an app or run a task with it (nsync)"}
	sub := func(use, short string, args cobra.PositionalArgs, build func([]string) []string) *cobra.Command {
		return &cobra.Command{Use: use, Short: short, Args: args,
			RunE: run(func(ns nsyncv1.NsyncServiceClient, cmd *cobra.Command, args []string) error {
				return appCommand(cmd.Context(), ns, build(args), c.out, c.err)
			})}
	}
	var del bool
	stop := sub("stop GUID", "Stop an app (--delete forgets it as well)", cobra.ExactArgs(1), func(a []string) []string {
		return []string{"stop", "-delete=" + strconv.FormatBool(del), a[0]}
	})
	stop.Flags().BoolVar(&del, "delete", false, "forget the app as well")
	task := sub("task GUID COMMAND...", "Run a one-off task with the app's rootfs, env and pool", cobra.MinimumNArgs(2), func(a []string) []string {
		return append([]string{"task", "--"}, a...)
	})
	task.Flags().SetInterspersed(false)
	var dep struct {
		strategy              string
		maxInFlight, canaries int
		minHealthy, deadline  time.Duration
		noRevert, wait        bool
		timeout               time.Duration
		version               int64
	}
	// deployFlags adds the deployment flags to cmd and passes them on to appCommand.
	deployFlags := func(cmd *cobra.Command, canary bool) *cobra.Command {
		cmd.Flags().StringVar(&dep.strategy, "strategy", "", "rolling (default), canary, or recreate (stops every old instance first: downtime)")
		cmd.Flags().IntVar(&dep.maxInFlight, "max-in-flight", 0, "new instances started before old ones stop (default 1)")
		if canary {
			cmd.Flags().IntVar(&dep.canaries, "canaries", 0, "canaries of a canary deployment (default 1)")
		}
		cmd.Flags().DurationVar(&dep.minHealthy, "min-healthy-time", 0, "how long new instances stay ready before old ones go")
		cmd.Flags().DurationVar(&dep.deadline, "progress-deadline", 0, "how long without progress before the deployment fails (default nsync's)")
		cmd.Flags().BoolVar(&dep.noRevert, "no-auto-revert", false, "do not revert a failed deployment (its new version is removed)")
		cmd.Flags().BoolVar(&dep.wait, "wait", false, "follow the deployment to its end: progress (new healthy / old left) and the exit code")
		cmd.Flags().DurationVar(&dep.timeout, "timeout", 10*time.Minute, "how long --wait waits")
		return cmd
	}
	depArgs := func(verb string, a []string) []string {
		out := []string{verb, "-strategy", dep.strategy, "-max-in-flight", strconv.Itoa(dep.maxInFlight), "-canaries", strconv.Itoa(dep.canaries),
			"-min-healthy-time", dep.minHealthy.String(), "-progress-deadline", dep.deadline.String(), "-no-auto-revert=" + strconv.FormatBool(dep.noRevert),
			"-wait=" + strconv.FormatBool(dep.wait), "-timeout", dep.timeout.String(), "-version", strconv.FormatInt(dep.version, 10)}
		return append(out, a...)
	}
	push := deployFlags(sub("push FILE", "Desire an app from YAML or JSON (an nsync App; - reads stdin); an existing app's changed definition is rolled out as a deployment", cobra.ExactArgs(1), func(a []string) []string { return depArgs("push", a) }), true)
	rollback := deployFlags(sub("rollback GUID", "Deploy an earlier version's definition again (default: the last healthy one before the serving one)", cobra.ExactArgs(1), func(a []string) []string { return depArgs("rollback", a) }), false)
	rollback.Flags().Int64Var(&dep.version, "version", 0, "the version to roll back to")
	waitOnly := func(verb, short string) *cobra.Command {
		cmd := sub(verb+" GUID", short, cobra.ExactArgs(1), func(a []string) []string {
			return append([]string{verb, "-wait=" + strconv.FormatBool(dep.wait), "-timeout", dep.timeout.String()}, a...)
		})
		cmd.Flags().BoolVar(&dep.wait, "wait", false, "follow the deployment to its end")
		cmd.Flags().DurationVar(&dep.timeout, "timeout", 10*time.Minute, "how long --wait waits")
		return cmd
	}
	app.AddCommand(
		push, rollback,
		sub("deployments GUID", "List an app's deployments: active, queued and recent", cobra.ExactArgs(1), func(a []string) []string { return append([]string{"deployments"}, a...) }),
		sub("versions GUID", "List an app's recent versions with their definitions", cobra.ExactArgs(1), func(a []string) []string { return append([]string{"versions"}, a...) }),
		waitOnly("promote", "Continue a canary deployment paused after its canaries became healthy"),
		waitOnly("cancel", "Cancel an app's deployment: it reverts to the serving version by the same steps"),
		sub("scale GUID N", "Set an app's instances", cobra.ExactArgs(2), func(a []string) []string { return append([]string{"scale"}, a...) }),
		sub("restart GUID", "Restart an app at its next version (zero downtime; applies a changed pool)", cobra.ExactArgs(1), func(a []string) []string { return append([]string{"restart"}, a...) }),
		stop, task,
	)

	pools := &cobra.Command{
		Use:   "pools",
		Short: "List placement pools, their spaces and the default; create, update, delete, bind, unbind",
		Args:  cobra.NoArgs,
		RunE: run(func(ns nsyncv1.NsyncServiceClient, cmd *cobra.Command, _ []string) error {
			return poolsCommand(cmd.Context(), ns, nil, c.out)
		}),
	}
	poolSub := func(use, short string, args cobra.PositionalArgs, build func([]string) []string) *cobra.Command {
		return &cobra.Command{Use: use, Short: short, Args: args,
			RunE: run(func(ns nsyncv1.NsyncServiceClient, cmd *cobra.Command, args []string) error {
				return poolsCommand(cmd.Context(), ns, build(args), c.out)
			})}
	}
	var require, disallow []string
	var force bool
	withTags := func(verb string) *cobra.Command {
		cmd := poolSub(verb+" NAME", verb+" a placement pool {require, disallow}", cobra.ExactArgs(1), func(a []string) []string {
			return []string{verb, "-require", strings.Join(require, ","), "-disallow", strings.Join(disallow, ","), a[0]}
		})
		cmd.Flags().StringSliceVar(&require, "require", nil, "tags every eligible cell carries (comma-separated)")
		cmd.Flags().StringSliceVar(&disallow, "disallow", nil, "tags no eligible cell carries (comma-separated)")
		return cmd
	}
	del2 := poolSub("delete NAME", "Delete a pool (--force unbinds its spaces first)", cobra.ExactArgs(1), func(a []string) []string {
		return []string{"delete", "-force=" + strconv.FormatBool(force), a[0]}
	})
	del2.Flags().BoolVar(&force, "force", false, "unbind the pool's spaces (and clear it as the default) first")
	pools.AddCommand(withTags("create"), withTags("update"), del2,
		poolSub("bind SPACE POOL", "Assign a pool to a space", cobra.ExactArgs(2), func(a []string) []string { return append([]string{"bind"}, a...) }),
		poolSub("unbind SPACE", "Remove a space's pool", cobra.ExactArgs(1), func(a []string) []string { return append([]string{"unbind"}, a...) }),
		poolSub("default [POOL]", "Set the default pool (no POOL clears it)", cobra.MaximumNArgs(1), func(a []string) []string { return append([]string{"default"}, a...) }),
	)
	return []*cobra.Command{apps, app, pools}
}
