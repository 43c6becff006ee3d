package layout

import (
	"context"
	"fmt"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/pkg/sealing"
)

// SealClear is the migration "encrypt the existing clear records": it seals, under keyring's
// active key, every clear value under prefixes (the records that carry user data), MaxBatch
// keys per transaction, each guarded by its mod revision; values already sealed (under any
// label) are left to the background re-encryption. Its cursor is the last key it looked at, so
// a resumed run starts after it. With encryption off (a nil keyring) it has nothing to do: the
// store moves to version to at once, and turning encryption on later is a rotation from clear
// (the background re-encryption seals those records).
func SealClear(to int, keyring *sealing.Keyring, prefixes ...string) Migration {
	prefixes = append([]string(nil), prefixes...)
	sort.Strings(prefixes)
	return Migration{To: to, Name: "seal the clear records of " + strings.Join(prefixes, ", "),
		Step: func(ctx context.Context, kv clientv3.KV, resume string) (Batch, error) {
			if keyring == nil {
				return Batch{Done: true}, nil
			}
			return sealStep(ctx, kv, keyring, prefixes, resume)
		}}
}

// sealStep scans from resume for the next page of keys holding at least one clear value.
func sealStep(ctx context.Context, kv clientv3.KV, keyring *sealing.Keyring, prefixes []string, resume string) (Batch, error) {
	for _, prefix := range prefixes {
		end := clientv3.GetPrefixRangeEnd(prefix)
		from := prefix
		if resume >= end {
			continue
		}
		if resume >= prefix {
			from = resume + "\x00"
		}
		for {
			resp, err := kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(MaxBatch),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
			if err != nil {
				return Batch{}, fmt.Errorf("list %s: %w", prefix, err)
			}
			if len(resp.Kvs) == 0 {
				break
			}
			var b Batch
			for _, item := range resp.Kvs {
				key := string(item.Key)
				if _, sealed, _ := sealing.LabelOf(item.Value); sealed {
					continue
				}
				v, err := keyring.Seal(key, item.Value)
				if err != nil {
					return Batch{}, err
				}
				b.Cmps = append(b.Cmps, clientv3.Compare(clientv3.ModRevision(key), "=", item.ModRevision))
				opts := []clientv3.OpOption{}
				if item.Lease != 0 {
					opts = append(opts, clientv3.WithLease(clientv3.LeaseID(item.Lease)))
				}
				b.Ops = append(b.Ops, clientv3.OpPut(key, string(v), opts...))
			}
			b.Resume = string(resp.Kvs[len(resp.Kvs)-1].Key)
			if len(b.Ops) > 0 {
				return b, nil
			}
			if !resp.More {
				break
			}
			from = b.Resume + "\x00" // a page already sealed: look further, writing nothing
		}
	}
	return Batch{Done: true}, nil
}
