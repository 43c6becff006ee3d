package rep_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
)

// TestSimHostRunsCellsOfTheirOwn: a sim host of three cells registers three cells, each on a
// port of its own presenting its own certificate ({cell} in the paths), each answering State;
// stopping the host revokes all three presences.
func TestSimHostRunsCellsOfTheirOwn(t *testing.T) {
	env := bbstest.Start(t)
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "admin", "rep/rack-0000", "rep/rack-0001", "rep/rack-0002")
	if err != nil {
		t.Fatal(err)
	}
	cfg := validConfig()
	cfg.CellID, cfg.Backend, cfg.Sim.Cells = "rack", rep.BackendSim, 3
	cfg.ListenAddress, cfg.CellAddress = "127.0.0.1:0", "127.0.0.1"
	cfg.BBSAddress, cfg.EtcdEndpoints = env.Addr, env.Etcd.Endpoints()
	cfg.WorkDir = t.TempDir()
	cfg.LeaseTTL = rep.Duration(2 * time.Second)
	ca := pki["admin"].CAFile
	cfg.TLS = tlsx.Config{CertFile: strings.ReplaceAll(pki["rep/rack-0000"].CertFile, "rack-0000", rep.CellPlaceholder),
		KeyFile: strings.ReplaceAll(pki["rep/rack-0000"].KeyFile, "rack-0000", rep.CellPlaceholder), CAFile: ca}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	host, err := rep.NewSimHost(cfg, logtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Close)
	run := testkit.Start(t, "sim host", host)

	var cells *bbsv1.CellsResponse
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		cells, err = env.Client.Cells(ctxT(t), &bbsv1.CellsRequest{})
		return err == nil && len(cells.GetCells()) == 3, cells.String()
	}, "three cells registered")
	var ids []string
	addrs := map[string]bool{}
	for _, c := range cells.GetCells() {
		ids = append(ids, c.GetCellId())
		addrs[c.GetRepAddress()] = true
		// The cell presents its own identity.
		admin, err := pki["admin"].ClientTLS()
		if err != nil {
			t.Fatal(err)
		}
		tc, err := tls.Dial("tcp", c.GetRepAddress(), admin)
		if err != nil {
			t.Fatalf("TLS to %s: %v", c.GetCellId(), err)
		}
		if cn := tc.ConnectionState().PeerCertificates[0].Subject.CommonName; !strings.Contains(cn, c.GetCellId()) {
			t.Errorf("cell %s presents %q", c.GetCellId(), cn)
		}
		_ = tc.Close()
		conn, err := grpcx.Dial(c.GetRepAddress(), grpcx.ClientConfig{TLS: pki["admin"]})
		if err != nil {
			t.Fatal(err)
		}
		st, err := repv1.NewRepServiceClient(conn).State(ctxT(t), &repv1.StateRequest{})
		_ = conn.Close()
		if err != nil || st.GetCellId() != c.GetCellId() {
			t.Errorf("State of %s: %v %v", c.GetCellId(), st.GetCellId(), err)
		}
	}
	sort.Strings(ids)
	if want := "rack-0000 rack-0001 rack-0002"; strings.Join(ids, " ") != want || len(addrs) != 3 {
		t.Errorf("cells %v at %d addresses, want %s at 3", ids, len(addrs), want)
	}
	if err := run.Stop(); err != nil {
		t.Fatal(err)
	}
	// The BBS serves cells from its cache, which learns of the revoked leases a moment later.
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		cells, err = env.Client.Cells(ctxT(t), &bbsv1.CellsRequest{})
		return err == nil && len(cells.GetCells()) == 0, fmt.Sprint(cells, err)
	}, "no cell after the host stopped")
}

// TestSimHostWaitsForALateEtcd: a sim host whose etcd is not reachable when it starts (as when
// thousands of cells queue for etcd's handshakes) tries again, and its cells connect once etcd
// answers, instead of the host failing at its first dial timeout.
func TestSimHostWaitsForALateEtcd(t *testing.T) {
	env := bbstest.Start(t)
	target := strings.TrimPrefix(env.Etcd.Endpoints()[0], "http://")
	late := testkit.ReservedAddr(t)
	// etcd appears at late only after the first dial timeout (5 s) has passed.
	go func() {
		time.Sleep(6 * time.Second)
		l, err := net.Listen("tcp", late)
		if err != nil {
			t.Errorf("listen %s: %v", late, err)
			return
		}
		t.Cleanup(func() { l.Close() })
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c) }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	cfg := validConfig()
	cfg.CellID, cfg.Backend, cfg.Sim.Cells = "late", rep.BackendSim, 2
	cfg.ListenAddress, cfg.CellAddress = "127.0.0.1:0", "127.0.0.1"
	cfg.BBSAddress, cfg.EtcdEndpoints = env.Addr, []string{"http://" + late}
	cfg.WorkDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	host, err := rep.NewSimHost(cfg, logtest.New(t))
	if err != nil {
		t.Fatalf("a sim host whose etcd came up 6 s late: %v", err)
	}
	t.Cleanup(host.Close)
	testkit.Start(t, "sim host", host)
	testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
		cells, err := env.Client.Cells(ctxT(t), &bbsv1.CellsRequest{})
		return err == nil && len(cells.GetCells()) == 2, cells.String()
	}, "both cells registered through the late etcd")
}
