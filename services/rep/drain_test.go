package rep_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs/bbstest"
	"github.com/gavel-sched/gavel/services/rep"
)

// syslogReceiver is a syslog server over TCP (or TLS) that parses octet-counted RFC 5424
// messages.
type syslogReceiver struct {
	l     net.Listener
	mu    sync.Mutex
	msgs  []string
	conns []net.Conn
}

// rfc5424 matches "<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID [SD] MSG".
var rfc5424 = regexp.MustCompile(`^<(\d{1,3})>1 (\S+) (\S+) (\S+) (\S+) (\S+) (\[.*?[^\\]\]) (.*)$`)

func newSyslogReceiver(t *testing.T, tlsConfig *tls.Config) *syslogReceiver {
	t.Helper()
	var l net.Listener = testkit.Listen(t)
	if tlsConfig != nil {
		l = tls.NewListener(l, tlsConfig)
	}
	r := &syslogReceiver{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			go r.read(c)
		}
	}()
	t.Cleanup(func() { r.dropConns() })
	return r
}

// read parses octet-counted frames until the connection ends.
func (r *syslogReceiver) read(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		n, err := br.ReadString(' ')
		if err != nil {
			return
		}
		size, err := strconv.Atoi(strings.TrimSpace(n))
		if err != nil {
			r.add("BAD FRAME " + n)
			return
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(br, buf); err != nil {
			return
		}
		r.add(string(buf))
	}
}

func (r *syslogReceiver) add(m string) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
}

// dropConns closes every accepted connection (the drain must reconnect).
func (r *syslogReceiver) dropConns() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// find returns the first message whose MSG is text.
func (r *syslogReceiver) find(text string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if p := rfc5424.FindStringSubmatch(m); p != nil && p[8] == text {
			return p
		}
	}
	return nil
}

func (r *syslogReceiver) addr() string { return r.l.Addr().String() }

// count is how many messages have arrived.
func (r *syslogReceiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// TestLogDrains: an instance's lines reach a syslog receiver over TCP and one over TLS as RFC
// 5424 messages with the LRP's structured data (process guid, index, instance guid, source),
// its log guid as APP-NAME, the cell as HOSTNAME and stderr at severity error; a receiver that
// drops the connection gets the later lines on a new one; a drain where nothing listens loses
// its lines, counted in gavel_rep_drain_lines_dropped_total, while the app and its log on the
// cell go on.
func TestLogDrains(t *testing.T) {
	pki, err := tlsx.GenerateDevPKI(t.TempDir(), "drain")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(pki["drain"].CertFile, pki["drain"].KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	plain := newSyslogReceiver(t, nil)
	secure := newSyslogReceiver(t, &tls.Config{Certificates: []tls.Certificate{cert}})
	dead := testkit.ReservedAddr(t)

	env := bbstest.Start(t)
	r := startRep(t, env, processRep(t.TempDir()), func(c *rep.Config) {
		c.MetricsAddress = "127.0.0.1:0"
		c.Logs.DrainCAFile = pki["drain"].CAFile
	})
	ctx := ctxT(t)
	d := shLRP("drained", `i=0; while true; do i=$((i+1)); echo "line $i"; [ $((i % 10)) = 0 ] && echo "oops $i" >&2; sleep 0.02; done`)
	d.LogGuid = "drained-app"
	d.LogDrains = []string{"syslog://" + plain.addr(), "syslog-tls://" + secure.addr(), "syslog://" + dead}
	desire(t, env, d)
	perform(t, r, []*repv1.LRPInstance{lrpWork(d, 0)}, nil)
	ig := waitRunning(t, env, r, "drained", 0).GetInstanceKey().GetInstanceGuid()

	sd := fmt.Sprintf(`[gavel@47450 process_guid="drained" index="0" instance_guid="%s" source="APP/PROC/WEB"]`, ig)
	for name, recv := range map[string]*syslogReceiver{"tcp": plain, "tls": secure} {
		var out, errLine []string
		testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
			out, errLine = recv.find("line 3"), recv.find("oops 10")
			return out != nil && errLine != nil, fmt.Sprintf("%d messages", recv.count())
		}, name+" drain receives line 3 and oops 10")
		if out[1] != "14" || out[3] != r.cfg.CellID || out[4] != "drained-app" || out[5] != "[APP/PROC/WEB/0]" || out[7] != sd {
			t.Errorf("%s drain: %q; want <14>, host %s, app drained-app, procid [APP/PROC/WEB/0], SD %s", name, out[0], r.cfg.CellID, sd)
		}
		if _, err := time.Parse(time.RFC3339Nano, out[2]); err != nil {
			t.Errorf("%s drain: timestamp %q: %v", name, out[2], err)
		}
		if errLine[1] != "11" {
			t.Errorf("%s drain: stderr line %q, want priority 11 (user.err)", name, errLine[0])
		}
	}

	// The receiver hangs up: the drain reconnects and later lines arrive.
	var last int
	testkit.Eventually(t, 10*time.Second, func() bool {
		plain.mu.Lock()
		defer plain.mu.Unlock()
		last = len(plain.msgs)
		return last > 0
	}, "messages")
	plain.dropConns()
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		plain.mu.Lock()
		defer plain.mu.Unlock()
		return len(plain.conns) > 0 && len(plain.msgs) > last+5, fmt.Sprintf("%d connections, %d messages", len(plain.conns), len(plain.msgs))
	}, "the drain reconnected and sends again")

	// The dead drain's lines are counted as dropped; the app and its log go on.
	testkit.EventuallyState(t, 10*time.Second, func() (bool, string) {
		body := testkit.Scrape(t, r.svc.MetricsAddr())
		return metricAbove(body, "gavel_rep_drain_lines_dropped_total", 0) && metricAbove(body, "gavel_rep_drain_lines_total", 10), "no drops counted yet"
	}, "drops counted")
	// The app goes on printing, and the cell goes on keeping its lines.
	all, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "drained"})
	if err != nil {
		t.Fatal(err)
	}
	next := fmt.Sprintf("line %d", countPrefix(all, "line ")+10)
	testkit.EventuallyState(t, 15*time.Second, func() (bool, string) {
		all, err := readLogs(ctx, r, &repv1.StreamLogsRequest{ProcessGuid: "drained"})
		return err == nil && hasLine(all, "APP/PROC/WEB", next), fmt.Sprintf("%d lines, %v", len(all), err)
	}, "the app's log goes on to "+next)
}

// countPrefix counts the lines whose text starts with prefix.
func countPrefix(lines []*repv1.LogLine, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l.GetText(), prefix) {
			n++
		}
	}
	return n
}

// metricAbove reports whether the sample of series (without labels) in a /metrics body is above v.
func metricAbove(body, series string, v float64) bool {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return err == nil && f > v
		}
	}
	return false
}
