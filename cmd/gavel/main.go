// Command gavel is Gavel's operator CLI, in the manner of Diego's cfdot and Nomad's nomad:
// `gavel dev` runs a local cluster on an embedded etcd, `gavel certs` writes a development
// PKI, and the other commands talk to the BBS (and the route-emitter and reps) over gRPC.
// `gavel --help` lists the commands; `gavel completion bash|zsh|fish` prints shell completion.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

func main() {
	ctx, stop := lifecycle.SignalContext(context.Background())
	err := execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gavel:", humanError(err))
	}
	os.Exit(exitCode(err))
}

// cli holds the global flags and the connections the commands share.
type cli struct {
	bbsAddrs     string
	routeEmitter string
	nsync        string
	tls          tlsx.Config
	output       string

	stdin    io.Reader
	out, err io.Writer
	conns    []*grpc.ClientConn
	bbs      bbsv1.BBSServiceClient
}

// execute runs the CLI with args (without the program name) and returns the command's error.
func execute(ctx context.Context, args []string, stdin io.Reader, out, errOut io.Writer) error {
	c := &cli{stdin: stdin, out: out, err: errOut}
	defer c.close()
	root := c.rootCommand()
	root.SetArgs(normalizeArgs(root, args))
	root.SetIn(stdin)
	root.SetOut(out)
	root.SetErr(errOut)
	return root.ExecuteContext(ctx)
}

func (c *cli) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "gavel",
		Short: "Operate a Gavel cluster: desire and inspect LRPs, tasks, cells and routes",
		Long: `gavel operates a Gavel cluster, in the manner of Diego's cfdot.

Lists print a table on a terminal; -o json|yaml gives stable, jq-friendly documents and
-o wide adds columns. In LRP files and in the output, routes documents are native JSON,
stored byte for byte. Exit codes: 0 ok, 1 error, 2 usage or invalid request, 3 refused
(authentication or permission), 4 not found, 5 conflict (exists, wrong state, lost race),
6 --wait timed out, 7 CELL_MISMATCH, 8 INSUFFICIENT_RESOURCES.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&c.bbsAddrs, "bbs", bbsclient.DefaultAddress, "BBS gRPC address, or several comma-separated BBS addresses")
	pf.StringVar(&c.routeEmitter, "route-emitter", "127.0.0.1:8893", "route-emitter gRPC address (for the routes command)")
	pf.StringVar(&c.nsync, "nsync", "127.0.0.1:8895", "nsync gRPC address (for the apps, app and pools commands)")
	pf.StringVar(&c.tls.CertFile, "tls-cert", envOr("GAVEL_TLS_CERT", ""), "client certificate (PEM) [$GAVEL_TLS_CERT]")
	pf.StringVar(&c.tls.KeyFile, "tls-key", envOr("GAVEL_TLS_KEY", ""), "client key (PEM) [$GAVEL_TLS_KEY]")
	pf.StringVar(&c.tls.CAFile, "tls-ca", envOr("GAVEL_TLS_CA", ""), "CA of the servers' certificates (PEM) [$GAVEL_TLS_CA]")
	pf.BoolVar(&c.tls.Insecure, "insecure", false, "plaintext gRPC (only what gavel dev --insecure serves)")
	pf.StringVarP(&c.output, "output", "o", "", "output format: json, yaml or wide (default: a table)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"json", "yaml", "wide"}, cobra.ShellCompDirectiveNoFileComp))
	if v := os.Getenv("GAVEL_BBS"); v != "" {
		c.bbsAddrs = v
	}

	root.AddGroup(
		&cobra.Group{ID: "lrp", Title: "Long-running processes:"},
		&cobra.Group{ID: "task", Title: "Tasks:"},
		&cobra.Group{ID: "cluster", Title: "Cells, domains and routing:"},
		&cobra.Group{ID: "apps", Title: "Apps and placement pools (nsync):"},
		&cobra.Group{ID: "local", Title: "Local cluster, certificates, keys and backups:"},
	)
	for _, cmd := range append(append(c.lrpCommands(), c.linksCommand()), c.accessCommands()...) {
		cmd.GroupID = "lrp"
		root.AddCommand(cmd)
	}
	for _, cmd := range c.taskCommands() {
		cmd.GroupID = "task"
		root.AddCommand(cmd)
	}
	for _, cmd := range c.clusterCommands() {
		cmd.GroupID = "cluster"
		root.AddCommand(cmd)
	}
	ui := c.uiCommand()
	ui.GroupID = "cluster"
	root.AddCommand(ui)
	for _, cmd := range c.nsyncCommands() {
		cmd.GroupID = "apps"
		root.AddCommand(cmd)
	}
	for _, cmd := range []*cobra.Command{c.devCommand(), c.certsCommand(), c.keysCommand(), c.backupCommand(), c.restoreCommand()} {
		cmd.GroupID = "local"
		root.AddCommand(cmd)
	}
	return root
}

// normalizeArgs accepts Go-flag style single-dash long flags (`-insecure`, `-bbs=ADDR`), which
// earlier versions of this CLI and its documentation used, by doubling the dash.
func normalizeArgs(root *cobra.Command, args []string) []string {
	long := map[string]bool{}
	var collect func(*cobra.Command)
	collect = func(cmd *cobra.Command) {
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) { long[f.Name] = true })
		cmd.PersistentFlags().VisitAll(func(f *pflag.Flag) { long[f.Name] = true })
		for _, sub := range cmd.Commands() {
			collect(sub)
		}
	}
	collect(root)
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "--" {
			copy(out[i:], args[i:])
			break
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if len(name) > 1 && long[name] {
				out[i] = "-" + a
			}
		}
	}
	return out
}

// envOr returns the environment variable's value, or def.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// printer returns the printer for the -o flag.
func (c *cli) printer() (*printer, error) { return newPrinter(c.out, c.output) }

// dial connects to addrs (comma-separated) with the global TLS settings.
func (c *cli) dial(addrs string) (*grpc.ClientConn, error) {
	if err := c.checkTLS(); err != nil {
		return nil, err
	}
	conn, err := grpcx.DialMulti(strings.Split(addrs, ","), grpcx.ClientConfig{TLS: c.tls})
	if err != nil {
		return nil, err
	}
	c.conns = append(c.conns, conn)
	return conn, nil
}

// checkTLS refuses to dial without a certificate or an explicit --insecure.
func (c *cli) checkTLS() error {
	if !c.tls.Insecure && c.tls.CertFile == "" && c.tls.KeyFile == "" && c.tls.CAFile == "" {
		return usageErrorf("no client certificate: pass --tls-cert, --tls-key and --tls-ca (or set $GAVEL_TLS_CERT, $GAVEL_TLS_KEY, $GAVEL_TLS_CA), or --insecure for a plaintext gavel dev --insecure")
	}
	return nil
}

// dialBBS connects to the BBS addresses the way every Gavel client does (pkg/bbsclient).
func (c *cli) dialBBS() (*grpc.ClientConn, error) {
	if err := c.checkTLS(); err != nil {
		return nil, err
	}
	conn, err := bbsclient.Dial(bbsclient.Config{BBSAddress: c.bbsAddrs, BBSTLS: c.tls})
	if err != nil {
		return nil, err
	}
	c.conns = append(c.conns, conn)
	return conn, nil
}

// bbsClient returns the (one) BBS client.
func (c *cli) bbsClient() (bbsv1.BBSServiceClient, error) {
	if c.bbs != nil {
		return c.bbs, nil
	}
	conn, err := c.dialBBS()
	if err != nil {
		return nil, err
	}
	c.bbs = bbsv1.NewBBSServiceClient(conn)
	return c.bbs, nil
}

// close closes every connection made.
func (c *cli) close() {
	for _, conn := range c.conns {
		conn.Close()
	}
}

// clients returns the printer for -o and the BBS client.
func (c *cli) clients() (*printer, bbsv1.BBSServiceClient, error) {
	p, err := c.printer()
	if err != nil {
		return nil, nil, err
	}
	bbs, err := c.bbsClient()
	if err != nil {
		return nil, nil, err
	}
	return p, bbs, nil
}

// completeFrom completes a command's first argument with the names list returns from the BBS.
func (c *cli) completeFrom(list func(ctx context.Context, bbs bbsv1.BBSServiceClient) ([]string, error)) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		bbs, err := c.bbsClient()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names, err := list(cmd.Context(), bbs)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// processGuids lists desired process guids (completion).
func processGuids(ctx context.Context, bbs bbsv1.BBSServiceClient) ([]string, error) {
	resp, err := bbs.DesiredLRPSchedulingInfos(ctx, &bbsv1.DesiredLRPSchedulingInfosRequest{})
	var guids []string
	for _, s := range resp.GetSchedulingInfos() {
		guids = append(guids, s.GetProcessGuid())
	}
	return guids, err
}

// taskGuids lists task guids (completion).
func taskGuids(ctx context.Context, bbs bbsv1.BBSServiceClient) ([]string, error) {
	resp, err := bbs.Tasks(ctx, &bbsv1.TasksRequest{})
	var guids []string
	for _, t := range resp.GetTasks() {
		guids = append(guids, t.GetTaskGuid())
	}
	return guids, err
}

// cellIDs lists present cells (completion).
func cellIDs(ctx context.Context, bbs bbsv1.BBSServiceClient) ([]string, error) {
	resp, err := bbs.Cells(ctx, &bbsv1.CellsRequest{})
	var ids []string
	for _, cp := range resp.GetCells() {
		ids = append(ids, cp.GetCellId())
	}
	return ids, err
}
