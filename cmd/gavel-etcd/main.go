// Command gavel-etcd runs an etcd server member built from the etcd Go module, so a deployment
// or the multi-host test bed (test/cluster) gets a static etcd binary from this repository.
// Flags describe a static cluster, as etcd's own:
//
//	gavel-etcd --name etcd-0 --data-dir /var/lib/etcd \
//	    --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls http://etcd-0:2379 \
//	    --listen-peer-urls http://0.0.0.0:2380 --initial-advertise-peer-urls http://etcd-0:2380 \
//	    --initial-cluster etcd-0=http://etcd-0:2380,etcd-1=http://etcd-1:2380,etcd-2=http://etcd-2:2380
//
// With --cert-file, --key-file and --trusted-ca-file it serves clients over TLS and requires
// client certificates of that CA (--client-cert-auth, on by default when a CA is given); the
// --peer-* flags do the same between members. Use https:// URLs then, and give etcd's HTTP
// endpoints URLs of their own with --listen-client-http-urls: the client URLs then serve gRPC
// only, on gRPC's own server rather than inside etcd's HTTP server, which over TLS costs etcd
// several times the CPU per request.
//
// --heartbeat-interval and --election-timeout are etcd's own (100 and 1000 ms by default). A
// leader confirms its leadership before renewing a lease when its raft loop has not ticked for
// three heartbeat intervals, and that confirmation waits for the apply loop: on a loaded machine
// a longer interval keeps lease renewals (the cells' presence) off the apply backlog.
//
// It logs at warn and stops on SIGINT/SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/gavel-sched/gavel/pkg/servicemain"
)

func main() { servicemain.Main("gavel-etcd", run) }

func run(args []string) error {
	cfg := embed.NewConfig()
	var listenClient, listenClientHTTP, advertiseClient, listenPeer, advertisePeer string
	fs := flag.NewFlagSet("gavel-etcd", flag.ContinueOnError)
	fs.StringVar(&cfg.Name, "name", "default", "member name")
	fs.StringVar(&cfg.Dir, "data-dir", "default.etcd", "data directory")
	fs.StringVar(&listenClient, "listen-client-urls", "http://127.0.0.1:2379", "comma-separated client URLs to listen on")
	fs.StringVar(&listenClientHTTP, "listen-client-http-urls", "", "comma-separated URLs for etcd's HTTP endpoints (/health, /metrics, /version); when set, the client URLs serve gRPC only, on gRPC's own server (over TLS several times cheaper than gRPC inside etcd's HTTP server); recommended with TLS")
	fs.StringVar(&advertiseClient, "advertise-client-urls", "http://127.0.0.1:2379", "comma-separated client URLs advertised to the cluster")
	fs.StringVar(&listenPeer, "listen-peer-urls", "http://127.0.0.1:2380", "comma-separated peer URLs to listen on")
	fs.StringVar(&advertisePeer, "initial-advertise-peer-urls", "http://127.0.0.1:2380", "comma-separated peer URLs advertised to the cluster")
	fs.StringVar(&cfg.InitialCluster, "initial-cluster", "", "name=peer-url,... of every member (default: this member alone)")
	fs.StringVar(&cfg.ClusterState, "initial-cluster-state", embed.ClusterStateFlagNew, "new|existing")
	fs.StringVar(&cfg.InitialClusterToken, "initial-cluster-token", "gavel-etcd", "cluster token")
	fs.UintVar(&cfg.TickMs, "heartbeat-interval", cfg.TickMs, "time (in milliseconds) of a heartbeat interval; a leader that has not ticked for three of them confirms its leadership (through its apply loop) before renewing a lease, so a loaded single member wants it longer")
	fs.UintVar(&cfg.ElectionMs, "election-timeout", cfg.ElectionMs, "time (in milliseconds) for an election to time out; at least five heartbeat intervals")
	fs.UintVar(&cfg.MaxTxnOps, "max-txn-ops", 2048, "most operations in one transaction (the BBS needs more than max_instances + 2)")
	fs.UintVar(&cfg.MaxRequestBytes, "max-request-bytes", cfg.MaxRequestBytes, "largest client request in bytes")
	fs.StringVar(&cfg.ClientTLSInfo.CertFile, "cert-file", "", "client-facing TLS certificate (PEM)")
	fs.StringVar(&cfg.ClientTLSInfo.KeyFile, "key-file", "", "client-facing TLS key (PEM)")
	fs.StringVar(&cfg.ClientTLSInfo.TrustedCAFile, "trusted-ca-file", "", "CA that client certificates must chain to (PEM)")
	fs.BoolVar(&cfg.ClientTLSInfo.ClientCertAuth, "client-cert-auth", true, "require client certificates when --trusted-ca-file is set")
	fs.StringVar(&cfg.PeerTLSInfo.CertFile, "peer-cert-file", "", "peer TLS certificate (PEM), server and client")
	fs.StringVar(&cfg.PeerTLSInfo.KeyFile, "peer-key-file", "", "peer TLS key (PEM)")
	fs.StringVar(&cfg.PeerTLSInfo.TrustedCAFile, "peer-trusted-ca-file", "", "CA that peer certificates must chain to (PEM)")
	fs.BoolVar(&cfg.PeerTLSInfo.ClientCertAuth, "peer-client-cert-auth", true, "require peer client certificates when --peer-trusted-ca-file is set")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	for _, u := range []struct {
		dst  *[]url.URL
		flag string
		val  string
	}{
		{&cfg.ListenClientUrls, "listen-client-urls", listenClient},
		{&cfg.AdvertiseClientUrls, "advertise-client-urls", advertiseClient},
		{&cfg.ListenPeerUrls, "listen-peer-urls", listenPeer},
		{&cfg.AdvertisePeerUrls, "initial-advertise-peer-urls", advertisePeer},
	} {
		if *u.dst, err = parseURLs(u.val); err != nil {
			return fmt.Errorf("--%s: %w", u.flag, err)
		}
	}
	if listenClientHTTP != "" {
		if cfg.ListenClientHttpUrls, err = parseURLs(listenClientHTTP); err != nil {
			return fmt.Errorf("--listen-client-http-urls: %w", err)
		}
	}
	cfg.ClientTLSInfo.ClientCertAuth = cfg.ClientTLSInfo.ClientCertAuth && cfg.ClientTLSInfo.TrustedCAFile != ""
	cfg.PeerTLSInfo.ClientCertAuth = cfg.PeerTLSInfo.ClientCertAuth && cfg.PeerTLSInfo.TrustedCAFile != ""
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	}
	cfg.LogLevel = "warn"
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "gavel-etcd: member %s ready, serving clients on %s\n", cfg.Name, listenClient)
	case err := <-e.Err():
		return err
	case <-ctx.Done():
		return nil
	}
	select {
	case err := <-e.Err():
		return err
	case <-ctx.Done():
		return nil // the deferred Close stops the member gracefully
	}
}

// parseURLs parses a comma-separated list of URLs.
func parseURLs(s string) ([]url.URL, error) {
	var out []url.URL
	for _, raw := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil {
			return nil, err
		}
		out = append(out, *u)
	}
	return out, nil
}
