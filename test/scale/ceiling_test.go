package scale

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// ceilingPrefix holds the keys of the etcd ceiling measurement, outside Gavel's root.
const ceilingPrefix = "/scale-ceiling/"

// ceiling is what the run's etcd accepts when nothing else writes to it.
type ceiling struct {
	// TxnPerSec is single-key compare-and-swap transactions per second.
	TxnPerSec float64
	// KeysPerSec is keys per second written in 64-key transactions.
	KeysPerSec float64
}

// measureCeiling measures etcd for d per figure with a bounded number of writers, then deletes
// its keys.
func measureCeiling(ctx context.Context, cli *clientv3.Client, d time.Duration) (ceiling, error) {
	value := strings.Repeat("x", 256)
	run := func(writers int, op func(ctx context.Context, w, i int) error) (float64, error) {
		var n atomic.Int64
		start := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		for w := 0; w < writers; w++ {
			g.Go(func() error {
				for i := 0; time.Since(start) < d; i++ {
					if err := op(gctx, w, i); err != nil {
						return err
					}
					n.Add(1)
				}
				return nil
			})
		}
		err := g.Wait()
		return float64(n.Load()) / time.Since(start).Seconds(), err
	}
	var c ceiling
	var err error
	// One key per writer and iteration, created if absent (a CAS on its mod revision, as
	// Gavel's transactions are).
	c.TxnPerSec, err = run(64, func(ctx context.Context, w, i int) error {
		key := fmt.Sprintf("%stxn/%d/%d", ceilingPrefix, w, i)
		_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, value)).Commit()
		return err
	})
	if err != nil {
		return c, fmt.Errorf("single-key transactions: %w", err)
	}
	var txns float64
	txns, err = run(8, func(ctx context.Context, w, i int) error {
		ops := make([]clientv3.Op, 64)
		for k := range ops {
			ops[k] = clientv3.OpPut(fmt.Sprintf("%sbatch/%d/%d/%d", ceilingPrefix, w, i, k), value)
		}
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return c, fmt.Errorf("64-key transactions: %w", err)
	}
	c.KeysPerSec = 64 * txns
	if _, err := cli.Delete(ctx, ceilingPrefix, clientv3.WithPrefix()); err != nil {
		return c, fmt.Errorf("delete the ceiling keys: %w", err)
	}
	return c, nil
}

// memory samples the Go heap and reads the process's peak RSS.
type memory struct {
	mu       sync.Mutex
	peakHeap uint64
}

// sample records the live heap every interval until ctx ends.
func (m *memory) sample(ctx context.Context, interval time.Duration) {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		metrics.Read(s)
		if s[0].Value.Kind() == metrics.KindUint64 {
			m.mu.Lock()
			m.peakHeap = max(m.peakHeap, s[0].Value.Uint64())
			m.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *memory) peak() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peakHeap
}

// peakRSS is the process's peak resident set (VmHWM), in bytes; 0 where /proc is absent.
func peakRSS() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

// writeHeapProfile writes a heap profile of the live objects to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return f.Close()
}
