package process

import (
	"bytes"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int

	mu  sync.Mutex
	buf []byte
}

// Write appends p, dropping the oldest bytes beyond max.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// lastLines returns the last complete lines that fit in n bytes, joined with " | " (a
// single line longer than n is cut from its start).
func (t *tailBuffer) lastLines(n int) string {
	t.mu.Lock()
	text := strings.TrimSpace(string(t.buf))
	t.mu.Unlock()
	if text == "" {
		return ""
	}
	lines := strings.Split(text, "\n")
	var picked []string
	size := 0
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if size+len(l) > n {
			if len(picked) == 0 {
				picked = append(picked, "…"+l[len(l)-n:])
			}
			break
		}
		picked = append(picked, l)
		size += len(l) + 3
	}
	for i, j := 0, len(picked)-1; i < j; i, j = i+1, j-1 {
		picked[i], picked[j] = picked[j], picked[i]
	}
	return strings.ToValidUTF8(strings.Join(picked, " | "), "")
}

// lineLogger writes each complete line at debug level.
type lineLogger struct {
	log     hclog.Logger
	partial []byte
}

// Write logs the complete lines of p and keeps the rest for the next call.
func (l *lineLogger) Write(p []byte) (int, error) {
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.log.Debug(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > 4<<10 {
		l.log.Debug(string(l.partial))
		l.partial = nil
	}
	return len(p), nil
}
