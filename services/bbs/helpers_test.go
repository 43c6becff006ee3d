package bbs_test

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

func clientPrefix() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }

// storeRevision is etcd's current revision: a refused request must leave it unchanged.
// (Shared by every test file of this package; do not redeclare it.)
func storeRevision(t *testing.T, env *bbstest.Env) int64 {
	t.Helper()
	resp, err := env.Etcd.Get(ctxT(t), "/gavel")
	if err != nil {
		t.Fatalf("read revision: %v", err)
	}
	return resp.Header.Revision
}
