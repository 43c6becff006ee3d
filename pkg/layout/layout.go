// Package layout versions what a service keeps in etcd and moves a store from the layout it
// holds to the one the code knows, before the service serves (see
// docs/decisions/0026-layout-versions-and-migrations.md).
//
// Each service has a layout key, etcdx.Root + "layout/<service>", holding a JSON State: the
// version the store is at and, while a migration runs, the version it is moving to and where it
// resumes. A store without the key is at version Base, the layout of the releases before
// versioning. At start-up every instance calls Upgrade: it refuses a store newer than the code
// (naming both versions), returns at once when the store is current, and otherwise takes the
// service's migration lock (a key under a lease), so that exactly one instance
// migrates while the others wait, then finds the version current and serves. Migrations run in
// order, one bounded batch per transaction; each batch's changes and the new resume point are
// committed together, guarded by the layout key's revision, so a migration interrupted at any
// point (the process killed, etcd unreachable) resumes after the last committed batch, by this
// instance or whichever takes the lock next.
package layout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/retry"
)

// Base is the version of a store without a layout key: the layout of the releases before
// versioning (the /gavel/v1/ keys, every record clear).
const Base = 1

// Key is the layout key of service.
func Key(service string) string { return etcdx.Root + "layout/" + service }

// lockService is the election prefix the migration lock of service lives under.
func lockService(service string) string { return service + "-layout" }

// State is the value of a layout key.
type State struct {
	// Version is the layout the store holds: every migration up to it is complete.
	Version int `json:"version"`
	// Migrating is the version the migration under way moves the store to (0: none). An
	// instance whose code is older than Migrating refuses the store as it refuses Version.
	Migrating int `json:"migrating,omitempty"`
	// Resume is where the migration under way resumes (its own cursor; "" from the start).
	Resume string `json:"resume,omitempty"`
}

// newest is the highest version s names.
func (s State) newest() int { return max(s.Version, s.Migrating) }

// Batch is one step of a migration: writes committed in one transaction with the new resume
// point, only if every compare holds (a record changed meanwhile makes the step run again).
type Batch struct {
	// Cmps guard Ops: typically each rewritten key's mod revision as the step read it.
	Cmps []clientv3.Cmp
	// Ops are the writes of the batch (at most MaxBatch keys, so that the transaction stays
	// within etcd's --max-txn-ops with the layout key's own write).
	Ops []clientv3.Op
	// Resume is the cursor after this batch, passed to the next step.
	Resume string
	// Done ends the migration: the store is at the migration's version once the batch commits.
	Done bool
}

// MaxBatch is the number of records a migration step should rewrite at most.
const MaxBatch = 64

// Migration moves a store from version To-1 to To.
type Migration struct {
	// To is the version the store holds once the migration is done.
	To int
	// Name says what it does, for the logs.
	Name string
	// Step reads what is left after resume ("" at the start) and returns the next batch. It
	// must be idempotent: a batch may be computed again after a lost compare or a restart.
	Step func(ctx context.Context, kv clientv3.KV, resume string) (Batch, error)
}

// Options configure Upgrade.
type Options struct {
	// Service names the layout key and the migration lock ("bbs", "nsync").
	Service string
	// Current is the layout version the code reads and writes.
	Current int
	// Migrations are the steps from Base to Current, one per version, in order.
	Migrations []Migration
	// LockTTL is the migration lock's lease: how long after a migrating instance dies
	// another may take over (default 10s).
	LockTTL time.Duration
	// Logger receives a line per migration started and done.
	Logger hclog.Logger
	// Progress, when set, is told the state after each committed batch.
	Progress func(State)
}

// TooNewError is a store whose layout is newer than the code knows.
type TooNewError struct {
	// Service is the service whose layout it is.
	Service string
	// Stored is the newest version the store holds or is being migrated to.
	Stored int
	// Code is the version this code knows.
	Code int
}

// Error implements error.
func (e *TooNewError) Error() string {
	return fmt.Sprintf("the store's %s layout is version %d, newer than this %s's version %d: run a %s release that knows layout %d (a downgrade needs a backup taken before the upgrade)",
		e.Service, e.Stored, e.Service, e.Code, e.Service, e.Stored)
}

// Read returns the layout state of service's store and the layout key's mod revision (0 when
// absent: the store is at Base).
func Read(ctx context.Context, kv clientv3.KV, service string) (State, int64, error) {
	s, rev, _, err := read(ctx, kv, service)
	return s, rev, err
}

// read is Read, with the revision of the store it read at.
func read(ctx context.Context, kv clientv3.KV, service string) (s State, modRev, storeRev int64, err error) {
	resp, err := kv.Get(ctx, Key(service))
	if err != nil {
		return State{}, 0, 0, fmt.Errorf("read %s: %w", Key(service), err)
	}
	if len(resp.Kvs) == 0 {
		return State{Version: Base}, 0, resp.Header.Revision, nil
	}
	if s, err = Parse(resp.Kvs[0].Value); err != nil {
		return State{}, 0, 0, fmt.Errorf("%s: %w", Key(service), err)
	}
	return s, resp.Kvs[0].ModRevision, resp.Header.Revision, nil
}

// Parse decodes a layout key's value.
func Parse(value []byte) (State, error) {
	var s State
	if err := json.Unmarshal(value, &s); err != nil || s.Version < Base {
		return State{}, fmt.Errorf("%q is not a layout state", value)
	}
	return s, nil
}

// Check reports a state newer than current as a *TooNewError.
func Check(s State, service string, current int) error {
	if s.newest() > current {
		return &TooNewError{Service: service, Stored: s.newest(), Code: current}
	}
	return nil
}

func (o *Options) validate() error {
	if o.Service == "" || o.Current < Base {
		return fmt.Errorf("layout: service %q, current version %d", o.Service, o.Current)
	}
	for i, m := range o.Migrations {
		if m.To != Base+1+i || m.Step == nil {
			return fmt.Errorf("layout %s: migration %d (%q) moves to version %d, want %d", o.Service, i, m.Name, m.To, Base+1+i)
		}
	}
	if len(o.Migrations) != o.Current-Base {
		return fmt.Errorf("layout %s: %d migrations for versions %d to %d", o.Service, len(o.Migrations), Base, o.Current)
	}
	if o.LockTTL <= 0 {
		o.LockTTL = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	return nil
}

// Upgrade brings the store to o.Current before the caller serves: nothing when it is current,
// a *TooNewError when it is newer, and otherwise the migrations from the stored version on,
// run by whichever instance holds the migration lock while the others wait for it.
func Upgrade(ctx context.Context, client *clientv3.Client, o Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	s, _, err := Read(ctx, client, o.Service)
	if err != nil {
		return err
	}
	if err := Check(s, o.Service, o.Current); err != nil {
		return err
	}
	if s.Version == o.Current && s.Migrating == 0 {
		return nil
	}
	o.Logger.Info("store layout is older than this release; taking the migration lock", "stored", s.Version, "code", o.Current)
	unlock, err := lock(ctx, client, etcdx.LockKey(lockService(o.Service)), o.LockTTL)
	if err != nil {
		return fmt.Errorf("layout %s: migration lock: %w", o.Service, err)
	}
	defer unlock()
	// The holder's writes are guarded by the layout key's revision too: a holder whose lease
	// expired while it was paused fails its next batch rather than race the new holder.
	return migrate(ctx, client, o)
}

// migrate runs the migrations from the stored version to o.Current, holding the lock.
func migrate(ctx context.Context, client *clientv3.Client, o Options) error {
	s, rev, err := Read(ctx, client, o.Service)
	if err != nil {
		return err
	}
	if err := Check(s, o.Service, o.Current); err != nil {
		return err
	}
	if s.Version == o.Current && s.Migrating == 0 {
		o.Logger.Info("store layout migrated by another instance", "version", s.Version)
		return nil
	}
	for _, m := range o.Migrations[s.Version-Base:] {
		if s.Migrating != m.To {
			s = State{Version: s.Version, Migrating: m.To}
		}
		start := time.Now()
		o.Logger.Info("migrating the store layout", "from", s.Version, "to", m.To, "migration", m.Name, "resume", s.Resume)
		batches := 0
		for {
			next, nrev, err := step(ctx, client, o, m, s, rev)
			if err != nil {
				return fmt.Errorf("layout %s: migration to %d (%s): %w", o.Service, m.To, m.Name, err)
			}
			s, rev = next, nrev
			batches++
			if o.Progress != nil {
				o.Progress(s)
			}
			if s.Migrating == 0 {
				break
			}
		}
		o.Logger.Info("store layout migrated", "version", s.Version, "migration", m.Name, "batches", batches, "took", time.Since(start))
	}
	return nil
}

// stepRetry is the wait between attempts of a batch whose records changed meanwhile.
var stepRetry = retry.Policy{Initial: 50 * time.Millisecond, Max: time.Second}

// errLayoutMoved is a batch refused because the layout key changed under the lock holder.
var errLayoutMoved = errors.New("the layout key changed while migrating (another instance took over)")

// step computes and commits one batch with its resume point, recomputing it when a record it
// read changed meanwhile (at most 8 attempts).
func step(ctx context.Context, client *clientv3.Client, o Options, m Migration, s State, rev int64) (State, int64, error) {
	key := Key(o.Service)
	backoff := stepRetry.BackOff()
	for attempt := 0; ; attempt++ {
		b, err := m.Step(ctx, client, s.Resume)
		if err != nil {
			return s, rev, err
		}
		next := State{Version: s.Version, Migrating: s.Migrating, Resume: b.Resume}
		if b.Done {
			next = State{Version: m.To}
		}
		v, err := json.Marshal(next)
		if err != nil {
			return s, rev, err
		}
		guard := clientv3.Compare(clientv3.ModRevision(key), "=", rev)
		resp, err := client.Txn(ctx).If(append([]clientv3.Cmp{guard}, b.Cmps...)...).
			Then(append(b.Ops, clientv3.OpPut(key, string(v)))...).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return s, rev, fmt.Errorf("commit batch: %w", err)
		}
		if resp.Succeeded {
			return next, resp.Header.Revision, nil
		}
		if g := resp.Responses[0].GetResponseRange(); len(g.Kvs) > 0 && g.Kvs[0].ModRevision != rev || len(g.Kvs) == 0 && rev != 0 {
			return s, rev, errLayoutMoved
		}
		if attempt == 7 {
			return s, rev, errors.New("records kept changing under the batch (8 attempts)")
		}
		retry.Sleep(ctx, backoff.NextBackOff())
		if ctx.Err() != nil {
			return s, rev, ctx.Err()
		}
	}
}

// Watch returns a *TooNewError as soon as the store's layout moves beyond current (an instance
// of a newer release began migrating it: this one must stop serving), and nil when ctx ends.
func Watch(ctx context.Context, client *clientv3.Client, service string, current int) error {
	for ctx.Err() == nil {
		s, _, rev, err := read(ctx, client, service)
		if err == nil {
			if err := Check(s, service, current); err != nil {
				return err
			}
			err = watchFrom(ctx, client, service, current, rev)
		}
		if ctx.Err() != nil {
			return nil
		}
		var tooNew *TooNewError
		if errors.As(err, &tooNew) {
			return err
		}
		retry.Sleep(ctx, time.Second) // etcd unreachable or the watch broke: read again
	}
	return nil
}

func watchFrom(ctx context.Context, client *clientv3.Client, service string, current int, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range client.Watch(wctx, Key(service), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return err
		}
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			if s, err := Parse(ev.Kv.Value); err == nil {
				if err := Check(s, service, current); err != nil {
					return err
				}
			}
		}
	}
	return errors.New("layout watch closed")
}

// upgradeRetry is the wait between failed attempts of Serve's Upgrade.
var upgradeRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// Serve is a service's layout member (pkg/lifecycle): it brings the store up to date with
// Upgrade, retrying while etcd is unreachable or a batch fails (a migration resumes where it
// stopped), and returns a *TooNewError at once; then it calls ready and, until ctx ends,
// returns a *TooNewError as soon as a newer release begins migrating the store (Watch), so the
// service stops rather than serve a layout it does not know. It returns nil when ctx ends.
func Serve(ctx context.Context, client *clientv3.Client, o Options, ready func()) error {
	err := retry.Do(ctx, upgradeRetry, 0, func() error {
		err := Upgrade(ctx, client, o)
		var tooNew *TooNewError
		if errors.As(err, &tooNew) {
			return retry.Permanent(err)
		}
		return err
	}, func(err error, next time.Duration) {
		if o.Logger != nil {
			o.Logger.Warn("bringing the store layout up to date failed; retrying", "error", err, "backoff", next)
		}
	})
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return err
	}
	ready()
	return Watch(ctx, client, o.Service, o.Current)
}

// lock takes key for this process: a key under a lease of ttl, written only when absent, kept
// alive while held; while another holds it, lock waits for the key's deletion (its holder's
// unlock, or its lease expiring when the holder died). unlock revokes the lease, even after
// ctx ended. It keeps the lease alive with single keep-alive calls rather than the client's
// keep-alive stream, whose goroutines would outlive the lock in the client.
func lock(ctx context.Context, client *clientv3.Client, key string, ttl time.Duration) (unlock func(), err error) {
	secs := max(1, int64(ttl/time.Second))
	grant, err := client.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	lease := grant.ID
	revoke := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = client.Revoke(rctx, lease)
	}
	for {
		resp, err := client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, fmt.Sprintf("%x", int64(lease)), clientv3.WithLease(lease))).Commit()
		if err != nil {
			revoke()
			return nil, err
		}
		if resp.Succeeded {
			break
		}
		if err := waitDeleted(ctx, client, key, resp.Header.Revision); err != nil {
			revoke()
			return nil, err
		}
		if _, err := client.KeepAliveOnce(ctx, lease); err != nil {
			revoke()
			return nil, fmt.Errorf("keep lease alive: %w", err)
		}
	}
	kctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Duration(secs) * time.Second / 3)
		defer t.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-t.C:
				_, _ = client.KeepAliveOnce(kctx, lease) // a failure shows as a lost guard on the next batch
			}
		}
	}()
	return func() {
		stop()
		<-done
		revoke()
	}, nil
}

// waitDeleted returns once key, present at rev, is deleted (or after a second, so that the
// waiter's lease is kept alive), or ctx ends.
func waitDeleted(ctx context.Context, client *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), time.Second)
	defer cancel()
	for resp := range client.Watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut()) {
		if err := resp.Err(); err != nil {
			break
		}
		if len(resp.Events) > 0 {
			return nil
		}
	}
	return ctx.Err()
}
