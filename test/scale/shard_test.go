package scale

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// BenchmarkEtcdShards measures what sharding the BBS's state over several etcd clusters would
// give on this machine (docs/performance.md, "Past one etcd"): for 1, 2 and 4 shards, that many
// gavel-etcd processes (fsync on, each its own data directory) take the ceiling's two write
// loads at once, and the figures are summed. A shard is one etcd member here; in a deployment
// each would be a cluster on machines of its own.
//
//	go test -run '^$' -bench EtcdShards -benchtime 1x ./test/scale/
func BenchmarkEtcdShards(b *testing.B) {
	for _, shards := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			clis := startEtcds(b, shards)
			for i := 0; i < b.N; i++ {
				var total ceiling
				results := make([]ceiling, shards)
				g, ctx := errgroup.WithContext(context.Background())
				for s, cli := range clis {
					g.Go(func() (err error) {
						results[s], err = measureCeiling(ctx, cli, 3*time.Second)
						return err
					})
				}
				if err := g.Wait(); err != nil {
					b.Fatal(err)
				}
				for _, r := range results {
					total.TxnPerSec += r.TxnPerSec
					total.KeysPerSec += r.KeysPerSec
				}
				b.ReportMetric(total.TxnPerSec, "single_key_txn/s")
				b.ReportMetric(total.KeysPerSec, "keys/s_in_64_key_txns")
				b.Logf("%d shards: %.0f single-key txn/s, %.0f keys/s in 64-key txns (per shard: %v)", shards, total.TxnPerSec, total.KeysPerSec, results)
			}
		})
	}
}

// startEtcds starts n gavel-etcd processes over TLS and returns a client of each.
func startEtcds(b *testing.B, n int) []*clientv3.Client {
	dir := b.TempDir()
	pki, err := tlsx.GenerateDevPKI(filepath.Join(dir, "pki"), "etcd", "admin")
	if err != nil {
		b.Fatal(err)
	}
	clis := make([]*clientv3.Client, n)
	for i := range clis {
		clientURL, _ := startGavelEtcd(b, fmt.Sprintf("shard-%d", i), filepath.Join(dir, fmt.Sprintf("etcd-%d", i)), pki["etcd"])
		cli, err := etcdx.Connect([]string{clientURL}, pki["admin"], logtest.New(b).Named("etcd"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cli.Close() })
		waitUntil(b, 30*time.Second, "etcd shard up", func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := cli.Get(ctx, "health")
			return err == nil, fmt.Sprint(err)
		})
		clis[i] = cli
	}
	return clis
}

// flagEtcdSharedHTTP serves etcd's HTTP endpoints and gRPC on the same client URL, etcd's
// default (gRPC then runs inside etcd's HTTP server), for the before/after comparison.
var flagEtcdSharedHTTP = flag.Bool("etcd-shared-http", false, "gavel-etcd serves HTTP and gRPC on one client URL (etcd's default) instead of gRPC alone")

// flagEtcdHeartbeat is gavel-etcd's heartbeat interval. A leader whose raft loop has not
// ticked for three intervals confirms its leadership through its apply loop before it renews a
// lease; with etcd's 100 ms, a single member sharing two cores with 5,000 cells' hosts and every
// service made every cell's renewal wait behind the apply backlog (docs/performance.md).
var flagEtcdHeartbeat = flag.Duration("etcd-heartbeat-interval", 500*time.Millisecond, "gavel-etcd's --heartbeat-interval (its election timeout is ten of them)")

// startGavelEtcd starts a one-member gavel-etcd called name with its data in dataDir, serving
// clients over mutual TLS with server's certificate, until the test ends; it returns its client
// URL and process. env is added to its environment.
func startGavelEtcd(t testing.TB, name, dataDir string, server tlsx.Config, env ...string) (string, *testkit.Proc) {
	clientURL, peerURL := "https://"+testkit.ReservedAddr(t), "http://"+testkit.ReservedAddr(t)
	args := []string{"-name", name, "-data-dir", dataDir,
		"-listen-client-urls", clientURL, "-advertise-client-urls", clientURL,
		"-listen-peer-urls", peerURL, "-initial-advertise-peer-urls", peerURL,
		"-cert-file", server.CertFile, "-key-file", server.KeyFile, "-trusted-ca-file", server.CAFile,
		"-heartbeat-interval", strconv.Itoa(int(flagEtcdHeartbeat.Milliseconds())),
		"-election-timeout", strconv.Itoa(int(10 * flagEtcdHeartbeat.Milliseconds()))}
	if !*flagEtcdSharedHTTP {
		// gRPC alone on the client URL, on gRPC's own server, as recommended with TLS.
		args = append(args, "-listen-client-http-urls", "https://"+testkit.ReservedAddr(t))
	}
	p := testkit.StartProcEnv(t, time.Minute, env, "gavel-etcd", testkit.Binary(t, "gavel-etcd"), args...)
	// Its clients are started once it serves, as a deployment starts them after etcd is
	// healthy: a single member elects itself within an election timeout (up to 5 s at the
	// 500 ms heartbeat), and a service that finds no etcd within its 5 s dial timeout exits.
	waitUntil(t, time.Minute, "gavel-etcd serving", func() (bool, string) {
		if p.Done() {
			t.Fatalf("gavel-etcd exited before serving; output:\n%s", p.Out.String())
		}
		return strings.Contains(p.Out.String(), etcdReadyLine), "not ready yet"
	})
	return clientURL, p
}

// etcdReadyLine is what gavel-etcd prints once it serves clients (cmd/gavel-etcd).
const etcdReadyLine = "ready, serving clients on"
