package store

import (
	"context"
	"fmt"
)

// Re-encryption. The cache knows the label each sealed record is stored under, so finding what
// is left to re-encrypt costs no etcd read. Reseal rewrites a batch of them unchanged through
// Update, the normal compare-and-swap path: a record changed meanwhile is not overwritten (the
// attempt is retried on fresh data or given up, to be found again by the next scan), and the
// change itself was written under the active key anyway. A rewrite publishes no event (see
// resealedOnly). Nothing is remembered between calls: after a restart or a change of leader,
// the next scan of the cache finds what is left.

// ToReseal counts the records of the kinds that are sealed (run infos, tasks) stored under
// another key than the active one, or clear, as of the cache. It is zero with encryption off.
func (s *Store) ToReseal() int {
	kr := s.opts.Keyring
	if kr == nil {
		return 0
	}
	n := 0
	s.cache.read(func(st *state, _ int64) {
		for _, t := range []map[string]item{st.run, st.tasks} {
			for _, it := range t {
				if kr.NeedsReseal(it.label) {
					n++
				}
			}
		}
	})
	return n
}

// Reseal rewrites up to Options.ResealBatch records that ToReseal counts under the active key,
// in one compare-and-swap transaction, and returns how many it rewrote (zero: none was left).
// A lost race is an error (rpcerr.Aborted); the caller tries again later.
func (s *Store) Reseal(ctx context.Context) (int, error) {
	kr := s.opts.Keyring
	if kr == nil {
		return 0, nil
	}
	var keys []string
	s.cache.read(func(st *state, _ int64) {
		for _, tk := range []struct {
			kind  kind
			items map[string]item
		}{{kindRun, st.run}, {kindTask, st.tasks}} {
			for id, it := range tk.items {
				if len(keys) == s.opts.ResealBatch {
					return
				}
				if kr.NeedsReseal(it.label) {
					keys = append(keys, parsedKey{kind: tk.kind, id: id}.String())
				}
			}
		}
	})
	if len(keys) == 0 {
		return 0, nil
	}
	n, _, err := UpdateValue(ctx, s, func(t *Txn) (int, error) {
		n := 0
		for _, key := range keys {
			m, err := t.get(key)
			if err != nil {
				return 0, err
			}
			if m == nil {
				continue // deleted meanwhile
			}
			if err := t.Put(key, m); err != nil {
				return 0, err
			}
			n++
		}
		return n, nil
	})
	if err != nil {
		return 0, fmt.Errorf("re-encrypt %d records: %w", len(keys), err)
	}
	return n, nil
}
