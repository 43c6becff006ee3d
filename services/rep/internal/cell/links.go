package cell

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/gavel-sched/gavel/pkg/atomicfile"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/links"
	"github.com/gavel-sched/gavel/pkg/retry"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// Environment variables and paths of the links a container consumes.
const (
	// LinksEnv holds, at start, the JSON of every resolved link keyed by link name.
	LinksEnv = "GAVEL_LINKS"
	// LinksDirEnv holds the directory of the link files, one <link name>.json per link,
	// rewritten atomically (rename over) whenever a link's resolution changes.
	LinksDirEnv = "GAVEL_LINKS_DIR"
	// linksDir is where the link files live inside a container, below its root.
	linksDir = ".gavel/links"
	// linkFileSuffix ends every link file's name.
	linkFileSuffix = ".json"
)

// LinkSource is what the cell asks the BBS about links.
type LinkSource interface {
	// ResolveLinks resolves a consumer's links for an instance on this cell.
	ResolveLinks(ctx context.Context, in *bbsv1.ResolveLinksRequest, opts ...grpc.CallOption) (*bbsv1.ResolveLinksResponse, error)
	// SubscribeToEvents streams the BBS events; the cell follows LinksChanged.
	SubscribeToEvents(ctx context.Context, in *bbsv1.SubscribeToEventsRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[bbsv1.SubscribeToEventsResponse], error)
}

// consumer is the link state of a container whose LRP consumes links.
type consumer struct {
	lrp    links.LRP
	signal bool

	mu    sync.Mutex
	rev   int64             // the revision of the resolution last written
	files map[string][]byte // file name → content last written
}

// linkFiles resolves the links of d for this cell and returns the documents as files and the
// GAVEL_LINKS JSON, with the revision resolved at.
func (c *Cell) linkFiles(ctx context.Context, l links.LRP) (map[string][]byte, []byte, int64, error) {
	var resp *bbsv1.ResolveLinksResponse
	err := c.call(ctx, "resolve links", func(ctx context.Context) error {
		var err error
		resp, err = c.bbs.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: l.Guid, CellId: c.cfg.CellID})
		return err
	})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("resolve links: %w", err)
	}
	docs := links.Documents(l, resp.GetLinks(), c.cfg.CellID)
	files := make(map[string][]byte, len(docs))
	for name, d := range docs {
		b, err := json.Marshal(d)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("encode link %s: %w", name, err)
		}
		files[name+linkFileSuffix] = b
	}
	all, err := json.Marshal(docs)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("encode links: %w", err)
	}
	return files, all, resp.GetRevision(), nil
}

// addLinks resolves the links the LRP consumes into the spec: GAVEL_LINKS in the environment
// and one file per link in the container's links directory (GAVEL_LINKS_DIR). It returns the
// container's link state, nil when the LRP consumes no links.
func (c *Cell) addLinks(ctx context.Context, d *modelsv1.DesiredLRP, spec *executor.Spec) (*consumer, error) {
	if len(d.GetLinks().GetConsumes()) == 0 {
		return nil, nil
	}
	l := links.FromDesired(d)
	files, all, rev, err := c.linkFiles(ctx, l)
	if err != nil {
		return nil, err
	}
	spec.Env = append(spec.Env, &modelsv1.EnvironmentVariable{Name: LinksEnv, Value: string(all)})
	spec.FilesDir = filepath.Join(linksDir, spec.Guid)
	spec.FilesDirEnv = LinksDirEnv
	spec.Files = files
	return &consumer{lrp: l, signal: d.GetLinks().GetSignalOnChange(), rev: rev, files: files}, nil
}

// FollowLinks implements lifecycle.Runner: it follows the BBS's LinksChanged events and
// rewrites the link files of the affected containers, re-subscribing (and refreshing every
// consumer, for the changes it may have missed) whenever the stream breaks. On the same stream
// it follows changes of an LRP's log drains (UpdateDesiredLRP) and switches the drains of its
// containers here (SetLogDrains); on every (re)subscription it also reconciles the drains of
// the running instances with the BBS's desired LRPs (ReconcileDrains), so a change made while
// the stream was broken applies once it is back.
func (c *Cell) FollowLinks(ctx context.Context, ready func()) error {
	ready()
	wait := retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}.BackOff()
	for {
		err := c.followLinks(ctx)
		if ctx.Err() != nil {
			return nil
		}
		backoff := wait.NextBackOff()
		c.log.Warn("links event stream ended; subscribing again", "error", err, "backoff", backoff)
		if !retry.Sleep(ctx, backoff) {
			return nil
		}
	}
}

func (c *Cell) followLinks(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Only the kinds followed here: the cell's own instance changes (two per placement) would
	// cost the BBS a send each for nothing.
	stream, err := c.bbs.SubscribeToEvents(sctx, &bbsv1.SubscribeToEventsRequest{Filter: &bbsv1.Filter{CellId: c.cfg.CellID},
		Kinds: []string{"links_changed", "desired_lrp_changed"}})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	// The first response (a bookmark or events) proves the subscription is live; refreshing
	// every consumer and reconciling every instance's drains then covers whatever changed
	// before it (a later change comes as an event).
	refreshed := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if !refreshed {
			refreshed = true
			for _, g := range c.consumerGuids() {
				c.RefreshLinks(ctx, g, 0)
			}
			if err := c.ReconcileDrains(ctx); err != nil {
				c.log.Warn("log drains not reconciled after subscribing; changes made meanwhile apply at the instances' next start", "error", err)
			}
		}
		for _, e := range resp.GetEvents() {
			if lc := e.GetLinksChanged(); lc != nil {
				c.RefreshLinks(ctx, lc.GetProcessGuid(), e.GetRevision())
			}
			if dc := e.GetDesiredLrpChanged(); dc != nil && !slices.Equal(dc.GetBefore().GetLogDrains(), dc.GetAfter().GetLogDrains()) {
				c.SetLogDrains(dc.GetAfter())
			}
		}
	}
}

// consumerGuids lists the process guids of the containers that consume links.
func (c *Cell) consumerGuids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]struct{}{}
	var out []string
	for _, ctr := range c.containers {
		if ctr.links == nil {
			continue
		}
		if _, ok := seen[ctr.key.GetProcessGuid()]; !ok {
			seen[ctr.key.GetProcessGuid()] = struct{}{}
			out = append(out, ctr.key.GetProcessGuid())
		}
	}
	return out
}

// RefreshLinks re-resolves the links of process guid and rewrites the files of its containers
// on this cell whose resolution is older than rev (every one when rev is 0).
func (c *Cell) RefreshLinks(ctx context.Context, guid string, rev int64) {
	type target struct {
		ctr  *container
		exec executor.Container
	}
	var targets []target
	c.mu.Lock()
	if rev > c.linksRev[guid] {
		c.linksRev[guid] = rev
	}
	for _, ctr := range c.containers {
		if ctr.links != nil && ctr.exec != nil && ctr.phase < phaseCompleted && ctr.key.GetProcessGuid() == guid {
			targets = append(targets, target{ctr, ctr.exec})
		}
	}
	c.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	files, _, newRev, err := c.linkFiles(ctx, targets[0].ctr.links.lrp)
	if err != nil {
		c.log.Warn("links changed but do not resolve; keeping the files", "process_guid", guid, "error", err)
		return
	}
	for _, t := range targets {
		c.writeLinks(t.ctr, t.exec, files, newRev)
	}
}

// adoptLinks registers the link consumer of an adopted LRP container as addLinks and
// linksRegistered do for a started one: the record keeps no links, so its desired LRP is
// fetched again; the link files as they are in the container are what was written (so only a
// change is written, and signalled), and one refresh applies what changed while no rep
// followed the links. The container keeps running meanwhile; an LRP gone from the BBS, or one
// that consumes no links, has no consumer.
func (c *Cell) adoptLinks(ctr *container, log hclog.Logger) {
	var desired *modelsv1.DesiredLRP
	err := c.call(ctr.ctx, "fetch desired lrp", func(ctx context.Context) error {
		resp, err := c.bbs.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: ctr.key.GetProcessGuid()})
		desired = resp.GetDesiredLrp()
		return err
	})
	if err != nil {
		log.Warn("adopted instance: its links are not followed", "error", err)
		return
	}
	if len(desired.GetLinks().GetConsumes()) == 0 {
		return
	}
	cons := &consumer{lrp: links.FromDesired(desired), signal: desired.GetLinks().GetSignalOnChange(), files: linkFilesIn(ctr.exec)}
	c.mu.Lock()
	ctr.links = cons
	c.mu.Unlock()
	c.RefreshLinks(ctr.ctx, ctr.key.GetProcessGuid(), 0)
}

// linkFilesIn reads the link files in exec's files directory (through an os.Root of its
// filesystem, as writeLinks writes them); nil when there are none or they cannot be read.
func linkFilesIn(exec executor.Container) map[string][]byte {
	rootDir, dir := exec.FilesPath()
	if rootDir == "" {
		return nil
	}
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return nil
	}
	defer root.Close()
	d, err := root.Open(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil
	}
	files := map[string][]byte{}
	for _, name := range names {
		if !strings.HasSuffix(name, linkFileSuffix) {
			continue
		}
		if b, err := root.ReadFile(filepath.Join(dir, name)); err == nil {
			files[name] = b
		}
	}
	return files
}

// linksRegistered is called once a consumer's container exists: a LinksChanged event that
// arrived between its resolution and now is applied.
func (c *Cell) linksRegistered(ctx context.Context, ctr *container) {
	if ctr.links == nil {
		return
	}
	c.mu.Lock()
	missed := c.linksRev[ctr.key.GetProcessGuid()]
	c.mu.Unlock()
	ctr.links.mu.Lock()
	stale := missed > ctr.links.rev
	ctr.links.mu.Unlock()
	if stale {
		c.RefreshLinks(ctx, ctr.key.GetProcessGuid(), 0)
	}
}

// writeLinks rewrites the files that changed (atomically), removes those of links gone, and
// signals the processes when the LRP asks for it.
func (c *Cell) writeLinks(ctr *container, exec executor.Container, files map[string][]byte, rev int64) {
	rootDir, dir := exec.FilesPath()
	l := ctr.links
	l.mu.Lock()
	defer l.mu.Unlock()
	if rootDir == "" || rev < l.rev {
		return
	}
	log := c.log.With("process_guid", ctr.key.GetProcessGuid(), "index", ctr.key.GetIndex(), "instance_guid", ctr.guid)
	// Every write goes through an os.Root of the container's filesystem: the container owns
	// what is inside it and may have made the files directory a link to a host path.
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		log.Warn("rewriting link files failed", "error", err)
		return
	}
	defer root.Close()
	changed := false
	var errs []error
	for name, b := range files {
		if string(l.files[name]) == string(b) {
			continue
		}
		if err := atomicfile.WriteIn(root, filepath.Join(dir, name), b, 0o644); err != nil {
			errs = append(errs, err)
			continue
		}
		changed = true
	}
	for name := range l.files {
		if _, ok := files[name]; !ok && strings.HasSuffix(name, linkFileSuffix) {
			if err := root.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
			changed = true
		}
	}
	if err := errors.Join(errs...); err != nil {
		log.Warn("rewriting link files failed", "error", err)
		return
	}
	l.files, l.rev = files, rev
	if !changed {
		return
	}
	log.Info("link files rewritten", "revision", rev)
	if l.signal {
		if err := exec.Signal(syscall.SIGHUP); err != nil {
			log.Warn("signalling the processes after a links change failed", "error", err)
		}
	}
}
