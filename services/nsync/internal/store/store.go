// Package store keeps nsync's records in etcd: apps, placement pools, the spaces bound to them
// and the default pool. Every write is one transaction; a write that depends on what was read
// compares the record's mod revision, and a lost race is rpcerr.Aborted.
//
// App records carry user data (env, command, routes) and are sealed with the keyring when
// encryption is on (pkg/sealing); pools, bindings and the default pool hold names and
// placement tags only and stay clear.
package store

import (
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/wire"
)

// Store reads and writes nsync's records.
type Store struct {
	kv      clientv3.KV
	keyring *sealing.Keyring
}

// New returns a store over an etcd client (or any clientv3.KV) that seals app records with
// keyring (nil: encryption off, new records clear).
func New(kv clientv3.KV, keyring *sealing.Keyring) *Store { return &Store{kv: kv, keyring: keyring} }

// App is an app record with the mod revision it was read at.
type App struct {
	// Record is the stored record.
	Record *nsyncv1.AppRecord
	// ModRevision is the record's mod revision, for compare-and-swap.
	ModRevision int64
	// KeyLabel is the label of the key the record is sealed under ("" when stored clear).
	KeyLabel string
}

// decodeApp opens and unmarshals the app record stored under key.
func (s *Store) decodeApp(key string, value []byte) (*nsyncv1.AppRecord, string, error) {
	plain, label, err := s.keyring.Open(key, value)
	if err != nil {
		return nil, label, fmt.Errorf("open %s: %w", key, err)
	}
	rec := &nsyncv1.AppRecord{}
	if err := wire.Unmarshal(plain, rec); err != nil {
		return nil, label, fmt.Errorf("decode %s: %w", key, err)
	}
	return rec, label, nil
}

// encodeApp marshals rec and seals it for key under the active key.
func (s *Store) encodeApp(key string, rec *nsyncv1.AppRecord) (string, error) {
	b, err := wire.Marshal(rec)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", key, err)
	}
	if b, err = s.keyring.Seal(key, b); err != nil {
		return "", fmt.Errorf("encode %s: %w", key, err)
	}
	return string(b), nil
}

// unavailable wraps an etcd failure; one without a gRPC code of its own becomes Unavailable.
func unavailable(what string, err error) error {
	if rpcerr.Code(err) == codes.Internal { // an etcd failure without a status of its own
		return rpcerr.Unavailable("%s: %v", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// GetApp reads the app guid; NotFound when there is none.
func (s *Store) GetApp(ctx context.Context, guid string) (App, error) {
	resp, err := s.kv.Get(ctx, appKey(guid))
	if err != nil {
		return App{}, unavailable("read app "+guid, err)
	}
	if len(resp.Kvs) == 0 {
		return App{}, rpcerr.NotFound("app %q not found", guid)
	}
	rec, label, err := s.decodeApp(appKey(guid), resp.Kvs[0].Value)
	if err != nil {
		return App{}, err
	}
	return App{Record: rec, ModRevision: resp.Kvs[0].ModRevision, KeyLabel: label}, nil
}

// Apps reads every app record, ordered by guid, and the revision they were read at.
func (s *Store) Apps(ctx context.Context) ([]App, int64, error) {
	resp, err := s.kv.Get(ctx, appPrefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, unavailable("list apps", err)
	}
	out := make([]App, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		rec, label, err := s.decodeApp(string(kv.Key), kv.Value)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, App{Record: rec, ModRevision: kv.ModRevision, KeyLabel: label})
	}
	return out, resp.Header.Revision, nil
}

// Revision is the store's current revision: a record with a higher ModRevision was written
// after this call.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	resp, err := s.kv.Get(ctx, appPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, unavailable("read the store's revision", err)
	}
	return resp.Header.GetRevision(), nil
}

// CreateApp stores a new app record; AlreadyExists when the guid is taken.
func (s *Store) CreateApp(ctx context.Context, rec *nsyncv1.AppRecord) (int64, error) {
	guid := rec.GetApp().GetGuid()
	v, err := s.encodeApp(appKey(guid), rec)
	if err != nil {
		return 0, err
	}
	resp, err := s.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(appKey(guid)), "=", 0)).
		Then(clientv3.OpPut(appKey(guid), v)).Commit()
	if err != nil {
		return 0, unavailable("create app "+guid, err)
	}
	if !resp.Succeeded {
		return 0, rpcerr.AlreadyExists("app %q already exists", guid)
	}
	return resp.Header.Revision, nil
}

// PutApp replaces the app record read at modRevision; Aborted when it changed since.
func (s *Store) PutApp(ctx context.Context, rec *nsyncv1.AppRecord, modRevision int64) (int64, error) {
	guid := rec.GetApp().GetGuid()
	v, err := s.encodeApp(appKey(guid), rec)
	if err != nil {
		return 0, err
	}
	resp, err := s.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(appKey(guid)), "=", modRevision)).
		Then(clientv3.OpPut(appKey(guid), v)).Commit()
	if err != nil {
		return 0, unavailable("write app "+guid, err)
	}
	if !resp.Succeeded {
		return 0, rpcerr.Aborted("app %q changed concurrently; retry", guid)
	}
	return resp.Header.Revision, nil
}

// DeleteApp deletes the app record read at modRevision; Aborted when it changed since.
func (s *Store) DeleteApp(ctx context.Context, guid string, modRevision int64) error {
	resp, err := s.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(appKey(guid)), "=", modRevision)).
		Then(clientv3.OpDelete(appKey(guid))).Commit()
	if err != nil {
		return unavailable("delete app "+guid, err)
	}
	if !resp.Succeeded {
		return rpcerr.Aborted("app %q changed concurrently; retry", guid)
	}
	return nil
}

// CreatePool stores a new pool; AlreadyExists when the name is taken.
func (s *Store) CreatePool(ctx context.Context, p *nsyncv1.PlacementPool) error {
	b, err := wire.Marshal(p)
	if err != nil {
		return err
	}
	resp, err := s.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(poolKey(p.GetName())), "=", 0)).
		Then(clientv3.OpPut(poolKey(p.GetName()), string(b))).Commit()
	if err != nil {
		return unavailable("create pool "+p.GetName(), err)
	}
	if !resp.Succeeded {
		return rpcerr.AlreadyExists("placement pool %q already exists", p.GetName())
	}
	return nil
}

// UpdatePool replaces an existing pool; NotFound when there is none.
func (s *Store) UpdatePool(ctx context.Context, p *nsyncv1.PlacementPool) error {
	b, err := wire.Marshal(p)
	if err != nil {
		return err
	}
	resp, err := s.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(poolKey(p.GetName())), ">", 0)).
		Then(clientv3.OpPut(poolKey(p.GetName()), string(b))).Commit()
	if err != nil {
		return unavailable("update pool "+p.GetName(), err)
	}
	if !resp.Succeeded {
		return rpcerr.NotFound("placement pool %q not found", p.GetName())
	}
	return nil
}

// Pool reads one pool; NotFound when there is none.
func (s *Store) Pool(ctx context.Context, name string) (*nsyncv1.PlacementPool, int64, error) {
	resp, err := s.kv.Get(ctx, poolKey(name))
	if err != nil {
		return nil, 0, unavailable("read pool "+name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, rpcerr.NotFound("placement pool %q not found", name)
	}
	p := &nsyncv1.PlacementPool{}
	if err := wire.Unmarshal(resp.Kvs[0].Value, p); err != nil {
		return nil, 0, fmt.Errorf("decode pool %s: %w", name, err)
	}
	return p, resp.Kvs[0].ModRevision, nil
}

// DeletePool deletes a pool. While a space is bound to it, or it is the default, it is
// FailedPrecondition naming them, unless force: then the bindings and the default go with it,
// in the same transaction.
func (s *Store) DeletePool(ctx context.Context, name string, force bool) error {
	_, modRev, err := s.Pool(ctx, name)
	if err != nil {
		return err
	}
	resp, err := s.kv.Txn(ctx).Then(
		clientv3.OpGet(poolBindings(name), clientv3.WithPrefix()),
		clientv3.OpGet(defaultKey)).Commit()
	if err != nil {
		return unavailable("read bindings of pool "+name, err)
	}
	bindings := resp.Responses[0].GetResponseRange().Kvs
	def := resp.Responses[1].GetResponseRange().Kvs
	isDefault := len(def) > 0 && string(def[0].Value) == name
	var spaces []string
	for _, kv := range bindings {
		spaces = append(spaces, spaceOf(name, string(kv.Key)))
	}
	if !force && (len(spaces) > 0 || isDefault) {
		what := fmt.Sprintf("bound to space(s) %v", spaces)
		if isDefault {
			what = "the default pool"
			if len(spaces) > 0 {
				what += fmt.Sprintf(" and bound to space(s) %v", spaces)
			}
		}
		return rpcerr.FailedPrecondition("placement pool %q is %s; unbind it first or delete with force", name, what)
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(poolKey(name)), "=", modRev),
		// Nothing under the pool's bindings changed (no new binding) since the read.
		clientv3.Compare(clientv3.ModRevision(poolBindings(name)).WithPrefix(), "<", resp.Header.Revision+1),
		clientv3.Compare(clientv3.ModRevision(defaultKey), "<", resp.Header.Revision+1),
	}
	ops := []clientv3.Op{clientv3.OpDelete(poolKey(name)), clientv3.OpDelete(poolBindings(name), clientv3.WithPrefix())}
	for _, sp := range spaces {
		ops = append(ops, clientv3.OpDelete(spaceKey(sp)))
		cmps = append(cmps, clientv3.Compare(clientv3.Value(spaceKey(sp)), "=", name))
	}
	if isDefault {
		ops = append(ops, clientv3.OpDelete(defaultKey))
	}
	t, err := s.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return unavailable("delete pool "+name, err)
	}
	if !t.Succeeded {
		return rpcerr.Aborted("placement pool %q or its bindings changed concurrently; retry", name)
	}
	return nil
}

// Pools is every pool with its spaces, and the default pool's name.
type Pools struct {
	// Pools are the pools by name.
	Pools map[string]*nsyncv1.PlacementPool
	// Spaces maps a space guid to its pool's name.
	Spaces map[string]string
	// Default is the default pool's name (empty: none).
	Default string
}

// For is the pool that applies to space: its bound pool, else the default, else nil.
func (p Pools) For(space string) *nsyncv1.PlacementPool {
	if name, ok := p.Spaces[space]; ok {
		return p.Pools[name]
	}
	return p.Pools[p.Default]
}

// AllPools reads every pool, binding and the default in one read.
func (s *Store) AllPools(ctx context.Context) (Pools, error) {
	resp, err := s.kv.Txn(ctx).Then(
		clientv3.OpGet(poolPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(spacePrefix, clientv3.WithPrefix()),
		clientv3.OpGet(defaultKey)).Commit()
	if err != nil {
		return Pools{}, unavailable("read pools", err)
	}
	out := Pools{Pools: map[string]*nsyncv1.PlacementPool{}, Spaces: map[string]string{}}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		p := &nsyncv1.PlacementPool{}
		if err := wire.Unmarshal(kv.Value, p); err != nil {
			return Pools{}, fmt.Errorf("decode %s: %w", kv.Key, err)
		}
		out.Pools[p.GetName()] = p
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		out.Spaces[string(kv.Key[len(spacePrefix):])] = string(kv.Value)
	}
	if d := resp.Responses[2].GetResponseRange().Kvs; len(d) > 0 {
		out.Default = string(d[0].Value)
	}
	return out, nil
}

// SpacesOf lists the spaces bound to pool, sorted.
func (p Pools) SpacesOf(pool string) []string {
	var out []string
	for sp, name := range p.Spaces {
		if name == pool {
			out = append(out, sp)
		}
	}
	slices.Sort(out)
	return out
}

// Bind binds space to pool (replacing its previous pool); NotFound when the pool does not exist.
func (s *Store) Bind(ctx context.Context, space, pool string) error {
	_, poolRev, err := s.Pool(ctx, pool)
	if err != nil {
		return err
	}
	resp, err := s.kv.Get(ctx, spaceKey(space))
	if err != nil {
		return unavailable("read space "+space, err)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(poolKey(pool)), "=", poolRev)}
	ops := []clientv3.Op{clientv3.OpPut(spaceKey(space), pool), clientv3.OpPut(bindingKey(pool, space), "")}
	if len(resp.Kvs) > 0 {
		old := string(resp.Kvs[0].Value)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(spaceKey(space)), "=", resp.Kvs[0].ModRevision))
		if old != pool {
			ops = append(ops, clientv3.OpDelete(bindingKey(old, space)))
		}
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(spaceKey(space)), "=", 0))
	}
	t, err := s.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return unavailable("bind space "+space, err)
	}
	if !t.Succeeded {
		return rpcerr.Aborted("space %q or pool %q changed concurrently; retry", space, pool)
	}
	return nil
}

// Unbind removes space's pool; NotFound when it has none.
func (s *Store) Unbind(ctx context.Context, space string) error {
	resp, err := s.kv.Get(ctx, spaceKey(space))
	if err != nil {
		return unavailable("read space "+space, err)
	}
	if len(resp.Kvs) == 0 {
		return rpcerr.NotFound("space %q has no placement pool", space)
	}
	old := string(resp.Kvs[0].Value)
	t, err := s.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(spaceKey(space)), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(spaceKey(space)), clientv3.OpDelete(bindingKey(old, space))).Commit()
	if err != nil {
		return unavailable("unbind space "+space, err)
	}
	if !t.Succeeded {
		return rpcerr.Aborted("space %q changed concurrently; retry", space)
	}
	return nil
}

// SetDefault names the default pool (empty clears it); NotFound when the pool does not exist.
func (s *Store) SetDefault(ctx context.Context, pool string) error {
	if pool == "" {
		if _, err := s.kv.Delete(ctx, defaultKey); err != nil {
			return unavailable("clear the default pool", err)
		}
		return nil
	}
	_, poolRev, err := s.Pool(ctx, pool)
	if err != nil {
		return err
	}
	t, err := s.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(poolKey(pool)), "=", poolRev)).
		Then(clientv3.OpPut(defaultKey, pool)).Commit()
	if err != nil {
		return unavailable("set the default pool", err)
	}
	if !t.Succeeded {
		return rpcerr.Aborted("placement pool %q changed concurrently; retry", pool)
	}
	return nil
}

// ResealApps rewrites up to batch app records not sealed under the active key (sealed under
// an older one, or clear), each unchanged through its own compare-and-swap (PutApp: one
// changed meanwhile is left for the next call, never overwritten), and returns how many it
// rewrote and how many are left. It lists every app: nsync keeps no cache.
func (s *Store) ResealApps(ctx context.Context, batch int) (rewritten, left int, err error) {
	apps, _, err := s.Apps(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, a := range apps {
		if !s.keyring.NeedsReseal(a.KeyLabel) {
			continue
		}
		if rewritten == batch {
			left++
			continue
		}
		if _, err := s.PutApp(ctx, a.Record, a.ModRevision); err != nil {
			if rpcerr.Code(err) == codes.Aborted {
				left++ // changed meanwhile: the next call looks at it again
				continue
			}
			return rewritten, 0, fmt.Errorf("re-encrypt app %s: %w", a.Record.GetApp().GetGuid(), err)
		}
		rewritten++
	}
	return rewritten, left, nil
}
