package bbs_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// metricLine returns the sample line of series (name and labels) from the BBS's /metrics.
func metricLine(t *testing.T, env *bbstest.Env, series string) string {
	t.Helper()
	for _, line := range strings.Split(testkit.Scrape(t, env.Service.MetricsAddr()), "\n") {
		if strings.HasPrefix(line, series+" ") {
			return line
		}
	}
	t.Fatalf("no series %s in /metrics", series)
	return ""
}

// TestAuctionsFailedMetric points the BBS at an auctioneer address that refuses connections:
// the auction requests of a desired LRP and a task fail, and gavel_bbs_auctions_failed_total
// counts their instances and tasks.
func TestAuctionsFailedMetric(t *testing.T) {
	env := bbstest.Start(t, func(c *bbs.Config) {
		c.AuctioneerAddress = testkit.ReservedAddr(t) // nothing listens there: connections are refused
		c.MetricsAddress = "127.0.0.1:0"
	})
	lrpSeries := `gavel_bbs_auctions_failed_total{kind="lrp"}`
	taskSeries := `gavel_bbs_auctions_failed_total{kind="task"}`
	if got := metricLine(t, env, lrpSeries); got != lrpSeries+" 0" {
		t.Fatalf("before any auction: %s", got)
	}
	if _, err := env.Client.DesireLRP(ctxT(t), &bbsv1.DesireLRPRequest{DesiredLrp: lrp("web", 3)}); err != nil {
		t.Fatal(err)
	}
	taskDesire(t, env, "t1", "apps", taskDefinition())
	want := map[string]string{lrpSeries: lrpSeries + " 3", taskSeries: taskSeries + " 1"}
	for series, line := range want {
		testkit.EventuallyState(t, 20*time.Second, func() (bool, string) {
			got := metricLine(t, env, series)
			return got == line, got
		}, line)
	}
}
