package testkit

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// SyslogReceiver is a syslog server on a loopback port, over TCP or TLS, that parses
// octet-counted RFC 5424 messages (RFC 6587 §3.4.1 framing, what the rep's drains send).
type SyslogReceiver struct {
	l     net.Listener
	mu    sync.Mutex
	msgs  []string
	conns []net.Conn
}

// rfc5424 matches "<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID [SD] MSG".
var rfc5424 = regexp.MustCompile(`^<(\d{1,3})>1 (\S+) (\S+) (\S+) (\S+) (\S+) (\[.*?[^\\]\]) (.*)$`)

// NewSyslogReceiver starts a receiver (over TLS with tlsConfig, else plain TCP); its
// connections are closed when the test ends.
func NewSyslogReceiver(t testing.TB, tlsConfig *tls.Config) *SyslogReceiver {
	t.Helper()
	l := Listen(t)
	if tlsConfig != nil {
		l = tls.NewListener(l, tlsConfig)
	}
	r := &SyslogReceiver{l: l}
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
	t.Cleanup(r.DropConns)
	return r
}

// read parses octet-counted frames until the connection ends.
func (r *SyslogReceiver) read(c net.Conn) {
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

func (r *SyslogReceiver) add(m string) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
}

// DropConns closes every accepted connection (a drain must reconnect).
func (r *SyslogReceiver) DropConns() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// Find returns the parts of the first message whose MSG is text: the whole message, PRI,
// TIMESTAMP, HOSTNAME, APP-NAME, PROCID, MSGID, STRUCTURED-DATA and MSG; nil when none came.
func (r *SyslogReceiver) Find(text string) []string {
	return r.find(func(msg string) bool { return msg == text })
}

// FindPrefix is Find of the first message whose MSG starts with prefix.
func (r *SyslogReceiver) FindPrefix(prefix string) []string {
	return r.find(func(msg string) bool { return strings.HasPrefix(msg, prefix) })
}

func (r *SyslogReceiver) find(match func(msg string) bool) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if p := rfc5424.FindStringSubmatch(m); p != nil && match(p[8]) {
			return p
		}
	}
	return nil
}

// Addr is the receiver's host:port.
func (r *SyslogReceiver) Addr() string { return r.l.Addr().String() }

// Count is how many messages have arrived.
func (r *SyslogReceiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// Conns is how many connections are open (accepted and not dropped).
func (r *SyslogReceiver) Conns() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}
