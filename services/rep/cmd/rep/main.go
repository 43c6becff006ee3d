// Command rep runs Gavel's cell agent: it registers the cell in etcd, serves State/Perform to
// the auctioneer and runs work through an executor backend.
//
//	rep -config rep.json
//	rep --cell-id cell-z1-0 --zone z1 --tags staging,skynet \
//	    --preloaded-rootfses '{"cflinuxfs4":"/var/gavel/rootfs/cflinuxfs4"}' \
//	    --supported-root-fs-providers docker --memory-mb 8192 --disk-mb 65536 --containers 250 \
//	    --backend process --listen :1800 --bbs-address bbs:8889 --etcd-endpoints https://etcd-0:2379 ...
//
// SIGTERM and SIGUSR1 evacuate the cell (its instances are started elsewhere before they stop)
// and then exit; SIGINT, or a second SIGTERM, exits at once.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/servicemain"
	"github.com/gavel-sched/gavel/services/rep"
)

func main() { servicemain.Main("rep", run) }

func run(args []string) error {
	cfg := rep.Default()
	fs := servicemain.NewFlagSet("rep")
	fs.StringVar(&cfg.CellID, "cell-id", cfg.CellID, "cell id")
	fs.StringVar(&cfg.Zone, "zone", cfg.Zone, "availability zone")
	fs.Var(config.List{Values: &cfg.Tags}, "tags", "comma-separated placement tags (case-insensitive)")
	fs.Var(config.JSONMap{Values: &cfg.PreloadedRootfses}, "preloaded-rootfses", `preloaded rootfses as JSON name→path, e.g. '{"cflinuxfs4":"/path"}'`)
	fs.Var(config.List{Values: &cfg.SupportedRootfsProviders}, "supported-root-fs-providers", "comma-separated rootfs providers, e.g. docker")
	fs.Var(int32Flag{&cfg.Capacity.MemoryMB}, "memory-mb", "memory capacity in MiB")
	fs.Var(int32Flag{&cfg.Capacity.DiskMB}, "disk-mb", "disk capacity in MiB")
	fs.Var(int32Flag{&cfg.Capacity.Containers}, "containers", "container capacity")
	fs.StringVar(&cfg.Backend, "backend", cfg.Backend, "executor backend: process|sim")
	fs.StringVar(&cfg.ListenAddress, "listen", cfg.ListenAddress, "gRPC listen address")
	fs.StringVar(&cfg.AdvertiseAddress, "advertise-address", cfg.AdvertiseAddress, "rep address registered in the cell presence (default: the bound listen address)")
	fs.StringVar(&cfg.CellAddress, "cell-address", cfg.CellAddress, "address instances are reached on")
	config.TLSFlags(fs, &cfg.TLS, "tls", "insecure", "server")
	bbsclient.Flags(fs, &cfg.Config)
	fs.Var(config.List{Values: &cfg.EtcdEndpoints}, "etcd-endpoints", "comma-separated etcd client URLs")
	config.TLSFlags(fs, &cfg.EtcdTLS, "etcd", "etcd-insecure", "etcd client")
	fs.Var(&cfg.LeaseTTL, "lease-ttl", "TTL of the cell presence's lease")
	fs.StringVar(&cfg.PortRange, "port-range", cfg.PortRange, "host port range, start-end")
	fs.StringVar(&cfg.WorkDir, "work-dir", cfg.WorkDir, "directory for containers and the rootfs cache")
	fs.StringVar(&cfg.RunAsUser, "run-as-user", cfg.RunAsUser, "unprivileged user processes drop to")
	fs.BoolVar(&cfg.ChrootPreloaded, "chroot-preloaded", cfg.ChrootPreloaded, "run processes of preloaded rootfses chrooted into their directory")
	fs.BoolVar(&cfg.InsecureRegistries, "insecure-registries", cfg.InsecureRegistries, "let the docker rootfs provider talk plain HTTP to registries (development only)")
	fs.Var(config.List{Values: &cfg.Hooks.OnCreate}, "on-create-hooks", "comma-separated executables run before a container starts (spec JSON on stdin)")
	fs.Var(config.List{Values: &cfg.Hooks.OnDestroy}, "on-destroy-hooks", "comma-separated executables run after a container stopped (spec JSON on stdin)")
	fs.Var(&cfg.Sim.StartLatency, "sim-start-latency", "sim backend: time to become healthy")
	fs.Float64Var(&cfg.Sim.CrashRate, "sim-crash-rate", cfg.Sim.CrashRate, "sim backend: crash probability per second")
	fs.Var(&cfg.BulkInterval, "bulk-interval", "how often containers are reconciled with the BBS")
	fs.Var(&cfg.EvacuationTimeout, "evacuation-timeout", "bound of an evacuation")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "serve Prometheus metrics at http://ADDRESS/metrics (empty: none)")
	config.LogFlags(fs, &cfg.Log)
	if err := servicemain.Parse(fs, args, &cfg); err != nil {
		return err
	}

	logger := logging.New("rep", cfg.Log).With("cell_id", cfg.CellID)
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	etcd, err := etcdx.Connect(cfg.EtcdEndpoints, cfg.EtcdTLS, logger.Named("etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	bbsConn, err := bbsclient.Dial(cfg.Config)
	if err != nil {
		return err // bbsclient.Dial names the BBS client
	}
	defer bbsConn.Close()
	backend, err := rep.NewBackend(cfg)
	if err != nil {
		return fmt.Errorf("executor backend: %w", err)
	}
	resolver, err := rep.NewResolver(cfg)
	if err != nil {
		return err
	}
	svc, err := rep.New(cfg, logger, etcd, bbsv1.NewBBSServiceClient(bbsConn), backend, resolver)
	if err != nil {
		return err
	}

	// SIGINT stops at once. SIGTERM (what process supervisors and container runtimes send) and
	// SIGUSR1 drain the cell first: the presence stays registered while the instances are
	// handed over, and is revoked when Run returns. A second SIGTERM stops at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	drain := make(chan os.Signal, 2)
	signal.Notify(drain, syscall.SIGTERM, syscall.SIGUSR1)
	defer signal.Stop(drain)
	go func() {
		select {
		case sig := <-drain:
			logger.Info("evacuating, then exiting", "signal", sig.String(), "timeout", cfg.EvacuationTimeout.String())
			evacCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			go func() {
				select {
				case sig := <-drain:
					logger.Warn("stopping before the evacuation is over", "signal", sig.String())
					stop()
				case <-evacCtx.Done():
				}
			}()
			if err := svc.Evacuate(evacCtx); err != nil {
				logger.Error("evacuation did not finish", "error", err)
			}
			stop()
		case <-ctx.Done():
		}
	}()
	return servicemain.Serve(ctx, logger, "rep", svc, "advertise_address", svc.AdvertiseAddress(), "backend", cfg.Backend)
}

// int32Flag is an int32 flag.
type int32Flag struct{ v *int32 }

// String implements flag.Value.
func (f int32Flag) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.Itoa(int(*f.v))
}

// Set implements flag.Value.
func (f int32Flag) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return err
	}
	*f.v = int32(n)
	return nil
}
