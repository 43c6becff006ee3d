package bbs_test

import (
	"fmt"
	"testing"
	"time"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/transform"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
)

// BenchmarkDesireLRPTransformers desires 2,000 LRPs of one instance from 64 concurrent clients
// through a BBS with 0, 1 and 3 transformer plugins (each adds a property over its own UNIX
// socket, served in this process), each over its own fsync'ing etcd, and reports the rates and
// their ratios to the rate without plugins.
func BenchmarkDesireLRPTransformers(b *testing.B) {
	const lrps = 2000
	ctx := benchCtx(b)
	rates := map[int]float64{}
	for _, n := range []int{0, 1, 3} {
		var plugins []transform.PluginConfig
		for i := range n {
			name := fmt.Sprintf("p%d", i)
			plugins = append(plugins, transform.PluginConfig{Name: name, Socket: servePlugin(b, propertyPlugin(name))})
		}
		env := bbstest.StartOn(b, startFsyncEtcd(b), func(c *bbs.Config) { c.Transformers = plugins })
		clients := dialBBS(b, env.Addr, benchConns)
		var elapsed time.Duration
		for it := range b.N {
			guids := benchGuids(fmt.Sprintf("tf%d", n), it, lrps)
			reqs := make([]*bbsv1.DesireLRPRequest, len(guids))
			for i, g := range guids {
				reqs[i] = &bbsv1.DesireLRPRequest{DesiredLrp: lrp(g, 1)}
			}
			start := time.Now()
			err := parallel(len(reqs), benchWorkers, func(w, i int) error {
				_, err := clients[w%len(clients)].DesireLRP(ctx, reqs[i])
				return err
			})
			elapsed += time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
		}
		rates[n] = float64(lrps*b.N) / elapsed.Seconds()
		b.ReportMetric(rates[n], fmt.Sprintf("lrps/s-%dplugins", n))
	}
	b.ReportMetric(rates[1]/rates[0], "ratio-1plugin")
	b.ReportMetric(rates[3]/rates[0], "ratio-3plugins")
}
