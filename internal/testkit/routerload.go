package testkit

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// GetThroughRouter sends one GET of / for host through the router at router and returns the
// body of a 200 answer; any other answer is an error naming its status and body.
func GetThroughRouter(client *http.Client, router, host string) ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+router+"/", nil)
	if err != nil {
		return nil, err
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	return body, nil
}

// RouterLoad sends GETs for a host through a router, one at a time and at most one per
// interval, until Finish or its bound of requests, counting answers other than 200 and failed
// requests (the zero-failure checks of restarts, deployments and evacuations).
type RouterLoad struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	stop       chan struct{}
	done       sync.WaitGroup
}

// StartRouterLoad starts a RouterLoad of at most n requests, one per every at most.
func StartRouterLoad(router, host string, n int, every time.Duration) *RouterLoad {
	l := &RouterLoad{stop: make(chan struct{})}
	client := &http.Client{Timeout: 5 * time.Second}
	l.done.Go(func() {
		defer client.CloseIdleConnections()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for range n {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			if _, err := GetThroughRouter(client, router, host); err != nil {
				l.failed.Add(1)
				l.firstErr.CompareAndSwap(nil, err.Error())
			} else {
				l.ok.Add(1)
			}
		}
	})
	return l
}

// Finish stops the load and returns the requests answered 200, those that failed, and the
// first failure.
func (l *RouterLoad) Finish() (ok, failed int64, first string) {
	close(l.stop)
	l.done.Wait()
	first, _ = l.firstErr.Load().(string)
	return l.ok.Load(), l.failed.Load(), first
}
