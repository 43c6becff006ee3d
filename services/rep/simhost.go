package rep

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// CellPlaceholder in a certificate or key path of a sim host's configuration (sim.cells > 1)
// is replaced by each hosted cell's id, so every cell presents its own identity.
const CellPlaceholder = "{cell}"

// SimCellID is the id of the i-th cell a sim host with cell_id prefix runs ("host-3" and 7 give
// "host-3-0007").
func SimCellID(prefix string, i int) string { return fmt.Sprintf("%s-%04d", prefix, i) }

// simCells reports what stops cfg from hosting sim.cells cells: they must be simulated, and each
// needs a listener of its own (port 0) and no metrics listener of its own.
func (c Config) simCells() error {
	if c.Sim.Cells < 0 {
		return fmt.Errorf("sim.cells must not be negative, got %d", c.Sim.Cells)
	}
	if c.Sim.Cells <= 1 {
		return nil
	}
	var errs []error
	if c.Backend != BackendSim {
		errs = append(errs, fmt.Errorf("sim.cells %d needs backend %q, got %q", c.Sim.Cells, BackendSim, c.Backend))
	}
	if _, port, err := net.SplitHostPort(c.ListenAddress); err != nil || port != "0" {
		errs = append(errs, fmt.Errorf("sim.cells %d needs listen_address host:0 (each cell listens on a port of its own), got %q", c.Sim.Cells, c.ListenAddress))
	}
	if c.AdvertiseAddress != "" {
		errs = append(errs, fmt.Errorf("sim.cells %d: advertise_address must be empty (each cell advertises its own port)", c.Sim.Cells))
	}
	if c.MetricsAddress != "" {
		errs = append(errs, fmt.Errorf("sim.cells %d: metrics_address must be empty (the hosted cells serve no /metrics)", c.Sim.Cells))
	}
	return errors.Join(errs...)
}

// forSimCell is the configuration of the i-th cell a sim host runs: its id (SimCellID), its
// own work directory, and {cell} in every certificate and key path replaced by its id.
func (c Config) forSimCell(i int) Config {
	cell := c
	cell.CellID = SimCellID(c.CellID, i)
	cell.WorkDir = filepath.Join(c.WorkDir, cell.CellID)
	cell.Sim.Cells = 1
	for _, t := range []*tlsx.Config{&cell.TLS, &cell.BBSTLS, &cell.EtcdTLS} {
		t.CertFile = strings.ReplaceAll(t.CertFile, CellPlaceholder, cell.CellID)
		t.KeyFile = strings.ReplaceAll(t.KeyFile, CellPlaceholder, cell.CellID)
	}
	return cell
}

// SimHost runs many simulated cells in one process (sim.cells > 1), for scale runs of the
// deployed binaries: each cell is a whole rep (Service) with its own id, identity, etcd client
// and presence lease, BBS connection and gRPC listener, as if it ran on a host of its own; they
// share only the process. Killing the process loses all its cells at once, like a rack.
type SimHost struct {
	log    hclog.Logger
	cells  []*Service
	closes []func()
}

// NewSimHost connects and builds cfg.Sim.Cells cells (cfg.forSimCell), simHostStarts at a
// time. Close releases their clients once Run has returned.
func NewSimHost(cfg Config, logger hclog.Logger) (*SimHost, error) {
	if cfg.Sim.Cells <= 1 {
		return nil, fmt.Errorf("sim host: sim.cells must be more than 1, got %d", cfg.Sim.Cells)
	}
	h := &SimHost{log: logger, cells: make([]*Service, cfg.Sim.Cells)}
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(simHostStarts)
	for i := range cfg.Sim.Cells {
		g.Go(func() error {
			cell := cfg.forSimCell(i)
			log := logger.With("cell_id", cell.CellID)
			// Thousands of cells starting at once queue for etcd's TLS handshakes: a cell that
			// cannot connect in time tries again, as a rep restarted by its supervisor would,
			// instead of taking its host's other cells down with it.
			var etcd *clientv3.Client
			err := retry.Do(context.Background(), simHostConnectRetry, simHostConnectTries, func() error {
				var err error
				etcd, err = cell.Etcd.Connect(log.Named("etcd"))
				return err
			}, func(err error, next time.Duration) {
				log.Warn("etcd not reachable yet; trying again", "error", err, "in", next)
			})
			if err != nil {
				return fmt.Errorf("cell %s: %w", cell.CellID, err)
			}
			mu.Lock()
			h.closes = append(h.closes, func() { _ = etcd.Close() })
			mu.Unlock()
			conn, err := bbsclient.Dial(cell.Config)
			if err != nil {
				return fmt.Errorf("cell %s: %w", cell.CellID, err)
			}
			mu.Lock()
			h.closes = append(h.closes, func() { _ = conn.Close() })
			mu.Unlock()
			svc, err := New(cell, log, etcd, bbsv1.NewBBSServiceClient(conn))
			if err != nil {
				return fmt.Errorf("cell %s: %w", cell.CellID, err)
			}
			h.cells[i] = svc
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// simHostStarts bounds the cells of a sim host that connect or start at once: a hundred cells
// starting one after another (each waits for its etcd connection, lease and first listings)
// took minutes on a loaded machine.
const simHostStarts = 16

// A hosted cell's etcd connection is tried simHostConnectTries times (each bounded by the etcd
// dial timeout, 5 s), simHostConnectRetry apart: at 5,000 cells, the 800 cells that connect at
// once took longer than one dial timeout.
const simHostConnectTries = 8

var simHostConnectRetry = retry.Policy{Initial: time.Second, Max: 5 * time.Second, Jitter: 0.2}

// Run runs every cell until ctx ends, starting simHostStarts at a time (lifecycle.Parallel);
// ready is called once all are registered. A cell that fails, or returns before ctx ends,
// stops them all.
func (h *SimHost) Run(ctx context.Context, ready func()) error {
	members := make([]lifecycle.Member, len(h.cells))
	for i, c := range h.cells {
		members[i] = lifecycle.Member{Name: "cell " + c.cfg.CellID, Runner: c}
	}
	return lifecycle.Parallel(simHostStarts, members...).Run(ctx, func() {
		h.log.Info("rep serving", "cells", len(h.cells), "first", h.cells[0].AdvertiseAddress(), "last", h.cells[len(h.cells)-1].AdvertiseAddress())
		if ready != nil {
			ready()
		}
	})
}

// ServeUntilSignal runs the host until SIGINT or SIGTERM (no evacuation: a scale run's host
// stops at once), then releases its clients.
func (h *SimHost) ServeUntilSignal() error {
	defer h.Close()
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	return h.Run(ctx, nil)
}

// Close releases the cells' etcd clients and BBS connections.
func (h *SimHost) Close() {
	for _, c := range h.closes {
		c()
	}
	h.closes = nil
}
