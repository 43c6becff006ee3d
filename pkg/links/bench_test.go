package links

import (
	"fmt"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// BenchmarkResolve1000x1000 resolves every one of 1,000 consumers (each consuming two links:
// one by type, one by name) over 1,000 providers of 3 running instances each; one op is all
// 1,000 resolutions.
func BenchmarkResolve1000x1000(b *testing.B) {
	const n = 1000
	x := NewIndex()
	w := world{}
	for i := 0; i < n; i++ {
		g := fmt.Sprintf("p-%d", i)
		x.Put(lrp(g, "cf", []uint32{8080}, []*modelsv1.LinkProvide{provide(fmt.Sprintf("svc-%d", i), fmt.Sprintf("type-%d", i), port(8080), props("k", "v"))}))
		for j := int32(0); j < 3; j++ {
			w[g] = append(w[g], inst(g, j, "cell-1", "z1", "10.0.0.1", 8080, uint32(60000+j)))
		}
	}
	consumers := make([]LRP, n)
	for i := 0; i < n; i++ {
		consumers[i] = lrp(fmt.Sprintf("c-%d", i), "cf", nil, nil,
			&modelsv1.LinkConsume{Name: "a", Type: fmt.Sprintf("type-%d", i)},
			&modelsv1.LinkConsume{Name: "b", From: fmt.Sprintf("svc-%d", (i+1)%n)})
		x.Put(consumers[i])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		for _, c := range consumers {
			if _, err := x.Resolve(c, w.get, ""); err != nil {
				b.Fatal(err)
			}
		}
	}
}
