// Package etcdtest starts a throwaway embedded etcd for tests.
package etcdtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdembed"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/porttest"
)

// startTimeout bounds how long Start waits for the server.
const startTimeout = 60 * time.Second

// Start runs a single-node etcd with fsync disabled and fast elections in a fresh temporary
// directory and returns it with a client connected to it. Both are closed
// when the test ends; etcd client errors are logged to t. Each configure, if
// any, may change the server's configuration before it starts.
func Start(t testing.TB, configure ...func(*etcdembed.Config)) (*etcdembed.Server, *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cfg := etcdembed.Config{
		Dir:           t.TempDir(),
		UnsafeNoFsync: true,
		Quiet:         true,
		FastElection:  true,
	}
	for _, c := range configure {
		c(&cfg)
	}
	e, err := etcdembed.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close embedded etcd: %v", err)
		}
	})

	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: e.Endpoints()}, logtest.New(t).Named("etcd-client"))
	if err != nil {
		t.Fatalf("connect to embedded etcd: %v", err)
	}
	// Registered after the server's cleanup, so it runs first.
	t.Cleanup(func() {
		if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("close etcd client: %v", err)
		}
	})
	return e, cli
}

// memberEnv carries, to a test binary started again by StartCluster, the JSON configuration
// of the etcd member it is to run.
const memberEnv = "GAVEL_ETCDTEST_MEMBER"

// RunMemberIfAsked runs the etcd member a StartCluster asked this process to run, and never
// returns then; otherwise it returns at once. A test package that uses StartCluster calls it
// first thing in its TestMain: its members are the package's own test binary started again,
// so that a test can kill them as an operator's outage would, without a graceful stop.
func RunMemberIfAsked() {
	js := os.Getenv(memberEnv)
	if js == "" {
		return
	}
	var cfg etcdembed.Config
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "etcd member: config: %v\n", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	srv, err := etcdembed.Start(ctx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd member: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(memberReady)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_ = srv.Run(ctx, nil)
	os.Exit(0)
}

// memberReady is the line a member process prints once it serves clients.
const memberReady = "etcd member ready"

// Cluster is a throwaway etcd cluster of members on loopback, each in a process of its own
// (this test binary started again; see RunMemberIfAsked) with its own data directory and
// fixed ports, so that a test can kill every member and start them again with their data, as
// an operator's outage would.
type Cluster struct {
	t       testing.TB
	members []*clusterMember
	// Client is connected to every member; it lives as long as the test.
	Client *clientv3.Client
}

type clusterMember struct {
	cfg  etcdembed.Config
	proc *exec.Cmd
}

// StartCluster runs an n-member etcd (fsync disabled; fast elections for a lone member,
// etcd's default timing otherwise) and returns it with a client connected to every member;
// both are stopped when the test ends. The test package's TestMain must call
// RunMemberIfAsked.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	var initial []string
	for i := range n {
		name := fmt.Sprintf("m%d", i)
		// Reserved, not ephemeral: a member killed and started again binds the same
		// addresses, which a listener on port 0 elsewhere could otherwise have taken meanwhile.
		peer, client := porttest.ReservedAddr(t), porttest.ReservedAddr(t)
		c.members = append(c.members, &clusterMember{cfg: etcdembed.Config{
			Dir: t.TempDir(), Name: name, PeerAddr: peer, ClientAddr: client, UnsafeNoFsync: true, Quiet: true,
			FastElection: n == 1,
		}})
		initial = append(initial, name+"=http://"+peer)
	}
	for _, m := range c.members {
		m.cfg.InitialCluster = strings.Join(initial, ",")
	}
	t.Cleanup(c.StopAll) // after the client's close below
	c.StartAll()
	cli, err := etcdx.NewClient(etcdx.Config{Endpoints: c.Endpoints()}, logtest.New(t).Named("etcd-client"))
	if err != nil {
		t.Fatalf("connect to the etcd cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("close etcd client: %v", err)
		}
	})
	c.Client = cli
	return c
}

// Endpoints are the client URLs of every member, running or not.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.members {
		out = append(out, "http://"+m.cfg.ClientAddr)
	}
	return out
}

// StopAll kills every running member (SIGKILL: no graceful stop); their data stay. It returns
// once the cluster's Client has noticed (its connection is no longer ready), so that what a
// test does next happens during the outage as every client sees it: a write sent in the
// instant before may have reached etcd.
func (c *Cluster) StopAll() {
	killed := false
	for _, m := range c.members {
		if m.proc != nil {
			_ = m.proc.Process.Kill()
			_ = m.proc.Wait()
			m.proc = nil
			killed = true
		}
	}
	if !killed || c.Client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	conn := c.Client.ActiveConnection()
	for st := conn.GetState(); st == connectivity.Ready; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			c.t.Fatalf("the etcd client still had a ready connection %s after every member was killed", startTimeout)
		}
	}
}

// StartAll starts every stopped member with its data, all at once (a member of a cluster is
// ready only once a quorum runs), and waits until each serves clients.
func (c *Cluster) StartAll() {
	c.t.Helper()
	errs := make(chan error, len(c.members))
	for _, m := range c.members {
		if m.proc != nil {
			errs <- nil
			continue
		}
		cmd, ready, err := startMember(c.t, m.cfg)
		if err != nil {
			errs <- err
			continue
		}
		m.proc = cmd
		go func() { errs <- <-ready }()
	}
	var failed []error
	for range c.members {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if err := errors.Join(failed...); err != nil {
		c.StopAll()
		c.t.Fatalf("start the etcd cluster: %v", err)
	}
}

// startMember starts this test binary again to run the member cfg; ready receives nil once it
// serves clients, or why it will not.
func startMember(t testing.TB, cfg etcdembed.Config) (*exec.Cmd, <-chan error, error) {
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memberEnv+"="+string(js))
	cmd.Stderr = &testWriter{t: t, prefix: cfg.Name + ": "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start member %s: %w", cfg.Name, err)
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == memberReady {
				ready <- nil
				_, _ = io.Copy(io.Discard, out)
				return
			}
		}
		ready <- fmt.Errorf("member %s exited before it was ready", cfg.Name)
	}()
	return cmd, ready, nil
}

// testWriter logs what a member process writes to the test's log.
type testWriter struct {
	t      testing.TB
	prefix string
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.t.Logf("%s%s", w.prefix, strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
