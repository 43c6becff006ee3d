package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
)

// runDev runs a local cluster in this process on an embedded etcd: the embedded default.
func runDev(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	dir := fs.String("dir", ".gavel/dev", "state directory (etcd data)")
	listen := fs.String("bbs-listen", "127.0.0.1:8889", "BBS gRPC address")
	level := fs.String("log-level", "info", "trace|debug|info|warn|error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := logging.New("gavel-dev", logging.Config{Level: *level})
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()

	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	etcd, err := etcdx.NewEmbedded(etcdx.EmbeddedConfig{Dir: filepath.Join(*dir, "etcd"), Quiet: true})
	if err != nil {
		return err
	}
	var svc *bbs.Service
	return lifecycle.Run(ctx, logger,
		lifecycle.Member{Name: "etcd", Runner: etcd},
		lifecycle.Member{Name: "bbs", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			cli, err := etcdx.NewClient(etcdx.Config{Endpoints: etcd.Endpoints()}, logger.Named("etcd-client"))
			if err != nil {
				return err
			}
			defer cli.Close()
			cfg := bbs.Default()
			cfg.ListenAddress = *listen
			cfg.TLS = tlsx.Config{Insecure: true}
			cfg.EtcdTLS = tlsx.Config{Insecure: true}
			cfg.EtcdEndpoints = etcd.Endpoints()
			cfg.Log.Level = *level
			if svc, err = bbs.New(cfg, logger.Named("bbs"), cli); err != nil {
				return err
			}
			return svc.Run(ctx, ready)
		})},
		lifecycle.Member{Name: "banner", Runner: lifecycle.RunFunc(func(ctx context.Context, ready func()) error {
			fmt.Fprintf(out, `
Gavel dev cluster is up.
  etcd (embedded): %v   data in %s
  BBS gRPC:        %s (plaintext; grpc reflection and health enabled)

Try:
  go run ./cmd/gavel -insecure desire-lrp examples/lrp.json
  go run ./cmd/gavel -insecure actual-lrps
  go run ./cmd/gavel -insecure events

Stop with Ctrl-C (state is kept in %s; delete it for a fresh cluster).
`, etcd.Endpoints(), *dir, svc.Addr(), *dir)
			ready()
			<-ctx.Done()
			return nil
		})},
	)
}
