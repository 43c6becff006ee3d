package auctioneer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/services/auctioneer"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// TestMetrics scrapes /metrics after a round that placed two instances and failed two.
func TestMetrics(t *testing.T) {
	env := bbstest.Start(t)
	startRep(t, env, cellSpec{id: "cell-1", zone: "z1", memoryMB: 512})
	waitCells(t, env, 1)
	a := startAuctioneer(t, env, func(c *auctioneer.Config) { c.MetricsAddress = "127.0.0.1:0" })
	requestLRPs(t, a, desire(t, env, "fits", 2, 128, nil), desire(t, env, "huge", 2, 4096, nil))
	testkit.Eventually(t, 15*time.Second, func() bool { return len(placementErrors(t, env, "huge")) == 2 }, "huge's placement errors")

	var body string
	want := []string{
		`gavel_auctioneer_auctions_failed_total{code="INSUFFICIENT_RESOURCES",kind="lrp"} 2`,
		`gavel_auctioneer_auctions_started_total{kind="lrp"} 2`,
		`gavel_auctioneer_leader 1`,
		`gavel_auctioneer_fetch_states_duration_seconds_count`,
		`gavel_auctioneer_perform_duration_seconds_count`,
		`gavel_auctioneer_rounds_total`,
		`go_goroutines`,
	}
	testkit.Eventually(t, 15*time.Second, func() bool {
		body = testkit.Scrape(t, a.svc.MetricsAddr())
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	}, "the metrics")
	if t.Failed() {
		t.Log(body)
	}
	t.Run("promtool", func(t *testing.T) { testkit.Promtool(t, body) })
}
