// Package procout handles the output of a container's processes for the executor backends:
// the tail of stderr kept for a failure reason, each line to the container's log sink (the
// cell's log store), and lines logged at debug level.
package procout

import (
	"bytes"
	"io"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// TailBuffer keeps the last max bytes written to it.
type TailBuffer struct {
	max int

	mu  sync.Mutex
	buf []byte
}

// NewTailBuffer keeps the last max bytes written to it.
func NewTailBuffer(max int) *TailBuffer { return &TailBuffer{max: max} }

// Write appends p, dropping the oldest bytes beyond max.
func (t *TailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// LastLines returns the last complete lines that fit in n bytes, joined with " | " (a
// single line longer than n is cut from its start).
func (t *TailBuffer) LastLines(n int) string {
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

// Sink receives a container's output lines: the cell's log store (logs.Instance). An empty
// source is the container's default source.
type Sink interface {
	Line(source, stream, text string)
}

// NewLineLogger logs each complete line written to it at debug level on log.
func NewLineLogger(log hclog.Logger) *LineWriter {
	return &LineWriter{emit: func(l string) { log.Debug(l) }}
}

// NewSinkWriter sends each complete line written to it to sink, labelled source and stream.
func NewSinkWriter(sink Sink, source, stream string) *LineWriter {
	return &LineWriter{emit: func(l string) { sink.Line(source, stream, l) }}
}

// LineWriter splits what is written to it into lines (a line longer than 4 KiB is cut) and
// emits each without its newline (and a trailing carriage return).
type LineWriter struct {
	emit    func(string)
	partial []byte
}

// Write emits the complete lines of p and keeps the rest for the next call.
func (l *LineWriter) Write(p []byte) (int, error) {
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.emit(strings.TrimSuffix(string(l.partial[:i]), "\r"))
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > 4<<10 {
		l.emit(string(l.partial))
		l.partial = nil
	}
	return len(p), nil
}

// Writer returns where a process's stream goes: each line to sink labelled source and stream
// (unless suppressed or sink is nil), debug log lines on log (unless suppressed or log is not
// at debug level) and, when tail is not nil, the tail kept for the failure reason.
func Writer(log hclog.Logger, suppress bool, tail *TailBuffer, sink Sink, source, stream string) io.Writer {
	var ws []io.Writer
	if tail != nil {
		ws = append(ws, tail)
	}
	if !suppress && sink != nil {
		ws = append(ws, NewSinkWriter(sink, source, stream))
	}
	if !suppress && log.IsDebug() {
		ws = append(ws, NewLineLogger(log))
	}
	if len(ws) == 0 {
		return io.Discard
	}
	return io.MultiWriter(ws...)
}
