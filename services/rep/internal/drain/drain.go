// Package drain forwards a container's log lines to syslog drains (the Cloud Foundry
// convention: "syslog://host:port" over TCP, "syslog-tls://host:port" over TLS), as RFC 5424
// messages with octet-counting framing (RFC 6587 §3.4.1, RFC 5425). Each drain of a container
// has a bounded queue and one goroutine that connects, writes and, when the drain goes away,
// reconnects with exponential backoff: a slow or dead drain loses lines, counted, and never
// blocks the container or the rep.
package drain

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/hashicorp/go-hclog"

	"github.com/gavel-sched/gavel/services/rep/internal/logs"
)

// Bounds of a drain.
const (
	// QueueLines is how many lines wait for a drain; more are dropped.
	QueueLines = 1024
	// WriteTimeout bounds one write: a drain that stops reading is dropped and redialled.
	WriteTimeout = 5 * time.Second
	// DialTimeout bounds one connection attempt.
	DialTimeout = 5 * time.Second
	// MaxBackoff bounds the wait between two connection attempts.
	MaxBackoff = 30 * time.Second
)

// Counters are a rep's drain counters, shared by all its drains.
type Counters struct {
	// Sent counts lines written to a drain's connection.
	Sent atomic.Int64
	// Dropped counts lines lost: the queue was full, or the drain was unreachable or failed.
	Dropped atomic.Int64
}

// Tags are what every message of a container carries.
type Tags struct {
	// Hostname is the RFC 5424 HOSTNAME: the cell id.
	Hostname string
	// AppName is the RFC 5424 APP-NAME: the LRP's log guid, else its process guid.
	AppName string
	// ProcessGuid, Index and InstanceGuid go into the structured data (of an LRP's instance).
	ProcessGuid  string
	Index        int32
	InstanceGuid string
	// TaskGuid, for a task's container, goes into the structured data instead of the process
	// guid and index.
	TaskGuid string
}

// Set is one container's drains.
type Set struct {
	mu     sync.RWMutex
	closed bool
	drains []*drain
}

// Open starts a drain for every URL (already validated at desire; a URL that does not parse is
// logged and skipped). Close the Set when the container is released.
func Open(urls []string, tags Tags, tlsConfig *tls.Config, counters *Counters, log hclog.Logger) *Set {
	s := &Set{}
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "syslog" && u.Scheme != "syslog-tls") || u.Port() == "" {
			log.Warn("skipping a log drain that is not syslog:// or syslog-tls://host:port", "drain", raw)
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		d := &drain{
			addr: u.Host, tls: u.Scheme == "syslog-tls", tlsConfig: tlsConfig, tags: tags,
			queue: make(chan logs.Line, QueueLines), counters: counters,
			log: log.With("drain", u.Scheme+"://"+u.Host), ctx: ctx, cancel: cancel, done: make(chan struct{}),
		}
		go d.run()
		s.drains = append(s.drains, d)
	}
	return s
}

// Line queues l for every drain without waiting; a full queue drops it and counts it.
func (s *Set) Line(l logs.Line) {
	if s == nil {
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return
	}
	for _, d := range s.drains {
		select {
		case d.queue <- l:
		default:
			d.counters.Dropped.Add(1)
		}
	}
}

// Close stops every drain after it sent what is queued (bounded by WriteTimeout per drain
// still connected; a drain not connected drops its queue at once).
func (s *Set) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range s.drains {
		wg.Go(func() {
			close(d.queue)
			select {
			case <-d.done:
			case <-time.After(WriteTimeout):
				d.cancel()
				<-d.done
			}
		})
	}
	wg.Wait()
}

// drain is one URL of one container.
type drain struct {
	addr      string
	tls       bool
	tlsConfig *tls.Config
	tags      Tags
	queue     chan logs.Line
	counters  *Counters
	log       hclog.Logger
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}
}

// run writes queued lines until the queue is closed, (re)connecting as needed; while it is
// not connected, lines are dropped.
func (d *drain) run() {
	defer close(d.done)
	defer d.cancel()
	var conn net.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 100*time.Millisecond, MaxBackoff
	var retryAt time.Time
	for l := range d.queue {
		if conn == nil {
			if time.Now().Before(retryAt) {
				d.counters.Dropped.Add(1)
				continue
			}
			c, err := d.dial()
			if err != nil {
				wait := b.NextBackOff()
				retryAt = time.Now().Add(wait)
				d.log.Debug("log drain unreachable", "error", err, "retry_in", wait)
				d.counters.Dropped.Add(1)
				continue
			}
			conn = c
			b.Reset()
		}
		msg := Format(l, d.tags)
		_ = conn.SetWriteDeadline(time.Now().Add(WriteTimeout))
		if _, err := conn.Write([]byte(strconv.Itoa(len(msg)) + " " + msg)); err != nil {
			d.log.Debug("log drain write failed; reconnecting", "error", err)
			_ = conn.Close()
			conn = nil
			d.counters.Dropped.Add(1)
			continue
		}
		d.counters.Sent.Add(1)
	}
}

// dial connects to the drain (over TLS for syslog-tls).
func (d *drain) dial() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(d.ctx, DialTimeout)
	defer cancel()
	if d.tls {
		cfg := d.tlsConfig.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(d.addr)
			cfg.ServerName = host
		}
		return (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", d.addr)
	}
	return (&net.Dialer{}).DialContext(ctx, "tcp", d.addr)
}

// Format renders l as an RFC 5424 message (without framing): facility user, severity info for
// stdout and error for stderr; PROCID "[SOURCE/INDEX]" as Cloud Foundry's does; structured
// data gavel@47450 with the process guid, index, instance guid and source (a task's: its task
// guid, instance guid and source; PROCID "[SOURCE]").
func Format(l logs.Line, t Tags) string {
	pri := 14 // user.info
	if l.Stream == logs.Stderr {
		pri = 11 // user.err
	}
	stamp := l.Time.UTC().Format(time.RFC3339Nano)
	if t.TaskGuid != "" {
		return fmt.Sprintf("<%d>1 %s %s %s %s - [gavel@47450 task_guid=\"%s\" instance_guid=\"%s\" source=\"%s\"] %s",
			pri, stamp, header(t.Hostname, 255), header(t.AppName, 48), header("["+l.Source+"]", 128),
			sdEscape(t.TaskGuid), sdEscape(t.InstanceGuid), sdEscape(l.Source), l.Text)
	}
	procID := fmt.Sprintf("[%s/%d]", l.Source, l.Index)
	return fmt.Sprintf("<%d>1 %s %s %s %s - [gavel@47450 process_guid=\"%s\" index=\"%d\" instance_guid=\"%s\" source=\"%s\"] %s",
		pri, stamp, header(t.Hostname, 255), header(t.AppName, 48), header(procID, 128),
		sdEscape(t.ProcessGuid), t.Index, sdEscape(t.InstanceGuid), sdEscape(l.Source), l.Text)
}

// header makes s a valid RFC 5424 header field: printable ASCII without spaces, at most n
// characters, "-" when empty.
func header(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r <= 32 || r >= 127 {
			return '_'
		}
		return r
	}, s)
	if len(s) > n {
		s = s[:n]
	}
	if s == "" {
		return "-"
	}
	return s
}

// sdEscape escapes a structured data value (RFC 5424 §6.3.3).
func sdEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, `]`, `\]`).Replace(s)
}
