package transform_test

import (
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/pkg/transform"
)

// BenchmarkCallOverSocket is the per-call overhead of one plugin over its UNIX socket, as the
// host sees it: encode the desired LRP, POST it, read and parse the answer, validate it. The
// plugin (in-process, on a real socket) adds one property. Each iteration makes 2,000
// sequential calls and reports their p50 and p99 (`make bench` runs one iteration).
func BenchmarkCallOverSocket(b *testing.B) {
	const calls = 2000
	socket := serve(b, addProperty("net", "app_guid", "app-1234"), nil)
	c, err := transform.Load(ctxT(b), []transform.PluginConfig{{Name: "net", Socket: socket}}, hclog.NewNullLogger(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	in := lrp()
	lat := make([]time.Duration, 0, calls*b.N)
	b.ResetTimer()
	for range b.N {
		for range calls {
			start := time.Now()
			if _, err := c.DesiredLRP(ctxT(b), in); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
