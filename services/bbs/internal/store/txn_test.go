package store

import (
	"errors"
	"testing"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// TestUpdateValueReturnsTheCommittedAttempt loses the first attempt's compare-and-swap to a
// concurrent write: UpdateValue runs fn again and returns the value of the attempt that
// committed, not of the one that lost; an error returns the zero value.
func TestUpdateValueReturnsTheCommittedAttempt(t *testing.T) {
	_, cli := etcdtest.Start(t)
	st := New(cli, Options{Logger: logtest.New(t)})
	testkit.Start(t, "store", st)
	ctx := t.Context()
	if _, err := st.Update(ctx, func(tx *Txn) error { return tx.PutPortOwner("tcp", 62000, "first") }); err != nil {
		t.Fatal(err)
	}

	attempts := 0
	got, rev, err := UpdateValue(ctx, st, func(tx *Txn) (string, error) {
		attempts++
		owner, err := tx.PortOwner("tcp", 62000)
		if err != nil {
			return "", err
		}
		if attempts == 1 {
			// A concurrent change of what this attempt read: its commit must fail.
			if _, err := st.Update(ctx, func(tx *Txn) error { return tx.PutPortOwner("tcp", 62000, "second") }); err != nil {
				return "", err
			}
		}
		return owner, tx.PutPortOwner("tcp", 62000, owner+"+")
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || got != "second" || rev == 0 {
		t.Fatalf("UpdateValue = %q at revision %d after %d attempts, want %q from the second attempt", got, rev, attempts, "second")
	}

	got, rev, err = UpdateValue(ctx, st, func(tx *Txn) (string, error) {
		return "dropped", rpcerr.Invalid("request", "refused")
	})
	if !errors.Is(err, rpcerr.ErrInvalid) || got != "" || rev != 0 {
		t.Fatalf("failed UpdateValue = %q, %d, %v; want the zero value, 0 and the error", got, rev, err)
	}
}
