package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gavel-sched/gavel/internal/devcluster"
	"github.com/gavel-sched/gavel/pkg/atomicfile"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/services/rep"
)

// sampleRoutes routes hello.gavel.local to port 8080 and 0.hello.gavel.local etc. to each index.
const sampleRoutes = `[{"port": 8080, "routes": ["hello.gavel.local"], "route_to_instances": true}]`

// devStacks maps the stacks nsync accepts in `gavel dev` onto the dev cells' preloaded
// rootfses: cflinuxfs4 on every cell, cflinuxfs3 on cell-1, lucid64 on cell-2.
var devStacks = map[string]string{
	"cflinuxfs4": "preloaded:cflinuxfs4",
	"cflinuxfs3": "preloaded:cflinuxfs3",
	"lucid64":    "preloaded:lucid64",
}

// runDev runs the embedded default: etcd, the BBS, the auctioneer, three process-backed cells,
// the route-emitter and the router in one process, and desires the sample app.
func (c *cli) devCommand() *cobra.Command {
	var o devOptions
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local cluster (embedded etcd and every service) until Ctrl-C",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), o, c.out)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.dir, "dir", ".gavel/dev", "state directory (etcd data, cell work dirs, preloaded rootfs)")
	fs.StringVar(&o.bbsAddr, "bbs-listen", "127.0.0.1:8889", "BBS gRPC address")
	fs.StringVar(&o.auctioneerAddr, "auctioneer-listen", "127.0.0.1:8890", "auctioneer gRPC address")
	fs.StringVar(&o.emitterAddr, "routeemitter-listen", "127.0.0.1:8893", "route-emitter gRPC address")
	fs.StringVar(&o.nsyncAddr, "nsync-listen", "127.0.0.1:8895", "nsync gRPC address")
	fs.StringVar(&o.routerHTTP, "router-http", "127.0.0.1:8080", "router HTTP address")
	fs.StringVar(&o.routerHTTPS, "router-https", "127.0.0.1:8443", "router HTTPS address")
	fs.StringVar(&o.routerAdmin, "router-admin", "127.0.0.1:8081", "router /healthz and /metrics address")
	fs.StringVar(&o.sample, "sample-app", "bin/hello", "sample app binary desired as LRP \"hello\" (empty: none)")
	fs.StringVar(&o.level, "log-level", "warn", "trace|debug|info|warn|error")
	fs.Var(goFlag{transform.Flag{Plugins: &o.plugins}, "NAME=SOCKET"}, "plugin", "transformer plugin NAME=SOCKET[,option=value...] the BBS runs every desired LRP and task through (repeat for a chain; see docs/plugins.md), e.g. --plugin networking=/tmp/gavel-networking.sock")
	fs.BoolVar(&o.keep, "keep-state", false, "keep etcd data from the last run (its instances' processes are gone, so they need convergence to come back)")
	fs.BoolVar(&o.insecure, "insecure", false, "serve plaintext gRPC (default: mutual TLS with a development PKI under --dir/pki)")
	fs.StringVar(&o.cellBackend, "cell-backend", rep.BackendProcess, "executor backend of the cells: process (host processes, any machine) or oci (containers through containerd, runc and CNI; needs root, see docs/operations.md)")
	fs.StringVar(&o.containerdSocket, "containerd-socket", rep.Default().OCI.ContainerdSocket, "with --cell-backend oci: containerd's socket")
	return cmd
}

// devOptions are `gavel dev`'s flags.
type devOptions struct {
	dir, bbsAddr, auctioneerAddr, emitterAddr, nsyncAddr, routerHTTP, routerHTTPS, routerAdmin, sample, level string
	cellBackend, containerdSocket                                                                             string
	keep, insecure                                                                                            bool
	plugins                                                                                                   []transform.PluginConfig
}

// goFlag adapts a standard library flag.Value to pflag's, which also names its type.
type goFlag struct {
	flag.Value
	typ string
}

// Type implements pflag.Value.
func (g goFlag) Type() string { return g.typ }

// runDev runs the embedded default: etcd, the BBS, the auctioneer, three process-backed cells,
// the route-emitter and the router in one process, and desires the sample app.
func runDev(ctx context.Context, o devOptions, out io.Writer) error {
	abs, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	oci := o.cellBackend == rep.BackendOCI
	if !oci && o.cellBackend != rep.BackendProcess {
		return fmt.Errorf("--cell-backend must be %q or %q, got %q", rep.BackendProcess, rep.BackendOCI, o.cellBackend)
	}
	if !o.keep {
		// A previous run's actual state is stale: its process containers died with it. Its oci
		// containers may not have (a killed run): the cells keep their work directories and
		// remove them at start, as a restarted rep removes what the BBS no longer wants.
		subs := []string{"etcd", "cells"}
		if oci {
			subs = subs[:1]
		}
		for _, sub := range subs {
			if err := os.RemoveAll(filepath.Join(abs, sub)); err != nil {
				return err
			}
		}
	}
	rootfs := filepath.Join(abs, "rootfs", "cflinuxfs4")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return err
	}
	var samplePath string
	if o.sample != "" {
		if samplePath, err = filepath.Abs(o.sample); err != nil {
			return err
		}
		if _, err := os.Stat(samplePath); err != nil {
			return fmt.Errorf("sample app: %w (build it with `go build -o bin/ ./examples/hello`, or pass -sample-app \"\")", err)
		}
		if oci {
			// A container sees its rootfs only: the sample app goes into it.
			if samplePath, err = copyIntoRootfs(samplePath, rootfs); err != nil {
				return err
			}
		}
	}

	cells := []struct {
		id, zone, tags, providers string
		ports                     string
		rootfses                  []string // preloaded, besides cflinuxfs4
	}{
		{"cell-1", "z1", "staging", "", "61000-61199", []string{"cflinuxfs3"}},
		{"cell-2", "z2", "production,skynet", "", "61200-61399", []string{"lucid64"}},
		{"cell-3", "z3", "production", "docker", "61400-61599", nil},
	}
	var specs []devcluster.Cell
	for _, c := range cells {
		cfg := rep.Default()
		cfg.CellID, cfg.Zone = c.id, c.zone
		cfg.Tags = strings.Split(c.tags, ",")
		cfg.PreloadedRootfses = map[string]string{"cflinuxfs4": rootfs}
		for _, name := range c.rootfses {
			dir := filepath.Join(abs, "rootfs", name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			cfg.PreloadedRootfses[name] = dir
		}
		if c.providers != "" {
			cfg.SupportedRootfsProviders = []string{c.providers}
			cfg.InsecureRegistries = true
		}
		cfg.PortRange = c.ports
		cfg.Capacity = rep.Capacity{MemoryMB: 4096, DiskMB: 16384, Containers: 50}
		cfg.WorkDir = filepath.Join(abs, "cells", c.id)
		if oci {
			cfg.Backend = rep.BackendOCI
			cfg.OCI.ContainerdSocket = o.containerdSocket
			// One containerd namespace per cell: a rep owns (adopts or removes) every
			// container of its namespace.
			cfg.OCI.Namespace = "gavel-dev-" + c.id
			// An empty directory: the default bridge + host-local + portmap network.
			cfg.OCI.CNIConfDir = filepath.Join(abs, "cni")
			if err := os.MkdirAll(cfg.OCI.CNIConfDir, 0o755); err != nil {
				return err
			}
		}
		specs = append(specs, devcluster.Cell{Config: cfg})
	}

	logger := logging.New("gavel-dev", logging.Config{Level: o.level})
	encryption, err := devEncryption(abs)
	if err != nil {
		return err
	}
	cluster := devcluster.New(devcluster.Config{
		Encryption:          encryption,
		Dir:                 abs,
		BBSAddress:          o.bbsAddr,
		AuctioneerAddress:   o.auctioneerAddr,
		Cells:               specs,
		Routing:             true,
		RouteEmitterAddress: o.emitterAddr,
		RouterHTTPAddress:   o.routerHTTP,
		RouterHTTPSAddress:  o.routerHTTPS,
		RouterAdminAddress:  o.routerAdmin,
		Transformers:        o.plugins,
		Nsync:               true,
		NsyncAddress:        o.nsyncAddr,
		NsyncStacks:         devStacks,
		Logger:              logger,
		TLS:                 !o.insecure,
	})
	return lifecycle.Run(ctx, logger,
		lifecycle.Member{Name: "cluster", Runner: cluster},
		lifecycle.Member{Name: "sample", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			fmt.Fprintf(out, "\nGavel dev cluster is up (state in %s).\n", abs)
			transport := "plaintext gRPC (--insecure)"
			if !o.insecure {
				transport = "mutual TLS, development PKI in " + filepath.Join(abs, "pki")
			}
			fmt.Fprintf(out, "  etcd (embedded): %v\n  BBS:             %s (%s)\n  auctioneer:      %s\n", cluster.EtcdEndpoints, cluster.BBSAddress, transport, cluster.AuctioneerAddress)
			fmt.Fprintf(out, "  encryption:      run infos, tasks and nsync apps sealed under key %q (%s)\n", devKeyLabel, encryption.Keys[0].File)
			fmt.Fprintf(out, "  nsync:           %s (stacks %s)\n", cluster.NsyncAddress, strings.Join(slices.Sorted(maps.Keys(devStacks)), ", "))
			fmt.Fprintf(out, "  route-emitter:   %s\n  router:          http://%s  https://%s (CA %s)  admin http://%s/healthz\n",
				cluster.RouteEmitterAddress, cluster.Router.HTTPAddr(), cluster.Router.HTTPSAddr(), cluster.RouterCA, cluster.Router.AdminAddr())
			for _, p := range o.plugins {
				fmt.Fprintf(out, "  transformer %s:  %s (%s)\n", p.Name, p.Socket, p.WithDefaults().FailurePolicy)
			}
			for _, c := range cells {
				fmt.Fprintf(out, "  cell %s: zone %s, tags %s, preloaded %s%s, %s backend\n", c.id, c.zone, c.tags,
					strings.Join(append([]string{"cflinuxfs4"}, c.rootfses...), ", "), map[bool]string{true: ", docker images", false: ""}[c.providers != ""], o.cellBackend)
			}
			if !oci {
				fmt.Fprintf(out, "  (real containers: run as root with containerd, runc and the CNI plugins installed, and add --cell-backend oci)\n")
			}
			if samplePath != "" {
				if err := desireSample(ctx, cluster.BBS, samplePath, out); err != nil {
					return err
				}
				if err := awaitRoute(ctx, cluster.Router.HTTPAddr().String(), "hello.gavel.local"); err != nil {
					return err
				}
				fmt.Fprintf(out, "\nThrough the router:\n  curl -H 'Host: hello.gavel.local' http://%s/      (round-robin)\n  curl -H 'Host: 0.hello.gavel.local' http://%s/    (index 0 only)\n",
					cluster.Router.HTTPAddr(), cluster.Router.HTTPAddr())
			}
			flags := "--insecure "
			if !o.insecure {
				admin := cluster.PKI["admin"]
				fmt.Fprintf(out, "\nThe CLI authenticates with a certificate (identity spiffe://gavel/admin, role admin):\n  export GAVEL_TLS_CERT=%s GAVEL_TLS_KEY=%s GAVEL_TLS_CA=%s\n",
					admin.CertFile, admin.KeyFile, admin.CAFile)
				flags = ""
			}
			cli := cliPath()
			fmt.Fprintf(out, "\nTry:\n  %[1]s %[2]s--bbs %[3]s cells\n  %[1]s %[2]s--bbs %[3]s actual-lrps --watch\n  %[1]s %[2]s--bbs %[3]s desire-lrp examples/lrp.yaml --wait\n  %[1]s %[2]s--route-emitter %[4]s routes\n  %[1]s %[2]s--nsync %[5]s pools create staging --require staging && %[1]s %[2]s--nsync %[5]s pools bind dev-space staging\n",
				cli, flags, cluster.BBSAddress, cluster.RouteEmitterAddress, cluster.NsyncAddress)
			if samplePath != "" {
				fmt.Fprintf(out, "  sed 's|@HELLO@|%[1]s|' examples/app.yaml | %[2]s %[3]s--nsync %[4]s app push - && %[2]s %[3]s--nsync %[4]s apps\n", samplePath, cli, flags, cluster.NsyncAddress)
			}
			fmt.Fprintf(out, "Stop with Ctrl-C.\n")
			ready()
			<-ctx.Done()
			return nil
		})},
	)
}

// copyIntoRootfs copies the executable at path into rootfs's /bin and returns its path as a
// container sees it.
func copyIntoRootfs(path, rootfs string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("sample app: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		return "", err
	}
	inside := "/bin/" + filepath.Base(path)
	// Replaced, not rewritten: a container of a killed run may still execute the old one.
	if err := atomicfile.Write(filepath.Join(rootfs, inside), data, 0o755); err != nil {
		return "", fmt.Errorf("sample app: %w", err)
	}
	return inside, nil
}

// cliPath is how the user ran this binary when that names gavel (bin/gavel under make run, which
// is not on $PATH), and otherwise "gavel" (go run's temporary binary is no use to print).
func cliPath() string {
	if filepath.Base(os.Args[0]) == "gavel" {
		return os.Args[0]
	}
	return "gavel"
}

// desireSample desires the sample app (once) and prints where its instances answer.
func desireSample(ctx context.Context, bbs bbsv1.BBSServiceClient, path string, out io.Writer) error {
	d := &modelsv1.DesiredLRP{
		ProcessGuid: "hello",
		Domain:      "examples",
		Rootfs:      "preloaded:cflinuxfs4",
		Instances:   3,
		MemoryMb:    64,
		DiskMb:      64,
		Ports:       []uint32{8080},
		Labels:      map[string]string{"app": "hello"},
		Properties:  map[string]string{"network.app_guid": "hello-app", "network.network_id": "dev"},
		Routes:      map[string][]byte{"cf-router": []byte(sampleRoutes)},
		Action:      &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path}}},
		CheckDefinition: &modelsv1.CheckDefinition{Checks: []*modelsv1.Check{
			{Kind: &modelsv1.Check_Http{Http: &modelsv1.HTTPCheck{Port: 8080, Path: "/health"}}},
		}},
	}
	_, err := bbs.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: d})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("desire the sample app: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := bbs.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{"hello"}}})
		if err != nil {
			return err
		}
		var urls []string
		for _, a := range resp.GetActualLrps() {
			if a.GetState() == modelsv1.ActualLRP_STATE_RUNNING && len(a.GetNetInfo().GetPorts()) > 0 {
				urls = append(urls, fmt.Sprintf("    index %d on %s: http://%s:%d/", a.GetKey().GetIndex(), a.GetInstanceKey().GetCellId(), a.GetNetInfo().GetAddress(), a.GetNetInfo().GetPorts()[0].GetHostPort()))
			}
		}
		if len(urls) == int(d.GetInstances()) {
			fmt.Fprintf(out, "\nSample app \"hello\" is RUNNING:\n%s\n", strings.Join(urls, "\n"))
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the sample app did not reach 3 RUNNING instances within 30s (see `gavel -insecure actual-lrps`)")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// awaitRoute waits (bounded) until the router answers 200 for host.
func awaitRoute(ctx context.Context, routerAddr, host string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+routerAddr+"/", nil)
		if err != nil {
			return err
		}
		req.Host = host
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the router did not route %s within 20s", host)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// devKeyLabel is the label of the development encryption key.
const devKeyLabel = "dev"

// devEncryption turns encryption at rest on for `gavel dev` with a key in DIR/keys/dev.key,
// written the first time and kept afterwards (a run with --keep-state reads what the last one
// sealed).
func devEncryption(dir string) (sealing.Config, error) {
	keys := filepath.Join(dir, "keys")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return sealing.Config{}, fmt.Errorf("dev encryption key: %w", err)
	}
	path := filepath.Join(keys, devKeyLabel+".key")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := sealing.WriteKeyFile(path); err != nil {
			return sealing.Config{}, fmt.Errorf("dev encryption key: %w", err)
		}
	}
	return sealing.Config{ActiveKeyLabel: devKeyLabel, Keys: []sealing.KeyFile{{Label: devKeyLabel, File: path}}}, nil
}
