package bbs_test

import (
	"errors"
	"regexp"
	"strconv"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// TestLeaderCompactsHistory runs a BBS that leads with a short compaction_interval: it
// compacts etcd's history up to a revision it read an interval earlier (etcd then refuses
// reads below it), publishes that revision as gavel_bbs_compacted_revision, keeps serving
// and writing, and a subscriber resuming from before it (past the event ring) is told to list
// again.
func TestLeaderCompactsHistory(t *testing.T) {
	env := bbstest.StartWith(t, nil, func(c *bbs.Config) {
		c.CompactionInterval = bbs.Duration(200 * time.Millisecond)
		c.MetricsAddress = "127.0.0.1:0"
		c.EventRing = 1 // resumes from before the last revisions go to etcd
	})
	testkit.Eventually(t, 10*time.Second, env.Service.IsLeader, "the BBS leads")
	for _, guid := range []string{"c-1", "c-2", "c-3"} {
		lrpDesire(t, env, guid, 2)
	}
	written := evCurrentRev(t, env)

	metric := regexp.MustCompile(`(?m)^gavel_bbs_compacted_revision (\S+)$`)
	var compacted int64
	testkit.Eventually(t, 10*time.Second, func() bool {
		m := metric.FindStringSubmatch(testkit.Scrape(t, env.Service.MetricsAddr()))
		if m == nil {
			return false
		}
		v, err := strconv.ParseFloat(m[1], 64)
		compacted = int64(v)
		return err == nil && compacted >= written
	}, "history compacted up to the last write")

	// etcd has dropped what was before the compacted revision, and keeps the revision itself.
	if _, err := env.Etcd.Get(ctxT(t), "/gavel", clientv3.WithPrefix(), clientv3.WithRev(written-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read at %d after compacting to %d: %v, want %v", written-1, compacted, err, rpctypes.ErrCompacted)
	}
	if _, err := env.Etcd.Get(ctxT(t), "/gavel", clientv3.WithPrefix(), clientv3.WithRev(compacted)); err != nil {
		t.Fatalf("read at the compacted revision %d: %v", compacted, err)
	}

	// A resume from before it cannot be served from etcd: the client is told to list again.
	s := evSubscribe(t, env, 1, nil)
	_, err := s.stream.Recv()
	wantCode(t, err, codes.OutOfRange)

	// The BBS serves and writes as before.
	lrpDesire(t, env, "c-4", 1)
	resp, err := env.Client.DesiredLRPs(ctxT(t), &bbsv1.DesiredLRPsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetDesiredLrps()); n != 4 {
		t.Fatalf("%d desired LRPs after compaction, want 4", n)
	}
}
