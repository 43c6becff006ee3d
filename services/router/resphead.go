package router

import (
	"bytes"
	"io"
	"net/http"
	"time"
)

// The request loop reads the common answer's head itself, in place in the backend
// connection's buffer, and writes it straight to the client: a final status with a
// Content-Length (or none needed) and nothing to stream or trail. parseRespHead refuses every
// other head, which http.ReadResponse then reads (loopanswer.go).

// respHead is one parsed answer head; its slices point into the backend connection's read
// buffer.
type respHead struct {
	code          int
	size          int   // bytes of the head, with its blank line
	contentLength int64 // -1: none
	close         bool  // the backend closes the connection after this answer
	hasDate       bool
	headers       []headerLine
	connection    []headerLine
}

// parseRespHead parses the complete head b into h for a request that is a HEAD or not, and
// reports whether the loop's own path may answer with it.
func parseRespHead(b []byte, head bool, h *respHead) bool {
	*h = respHead{headers: h.headers[:0], connection: h.connection[:0], size: len(b), contentLength: -1}
	line, rest, _ := bytes.Cut(b, []byte("\r\n"))
	var http10 bool
	switch {
	case bytes.HasPrefix(line, []byte("HTTP/1.1 ")):
	case bytes.HasPrefix(line, []byte("HTTP/1.0 ")):
		http10 = true
	default:
		return false
	}
	line = line[len("HTTP/1.1 "):]
	if len(line) < 3 || len(line) > 3 && line[3] != ' ' {
		return false
	}
	for _, c := range line[:3] {
		if c < '0' || c > '9' {
			return false
		}
		h.code = h.code*10 + int(c-'0')
	}
	if h.code < 200 || h.code > 599 {
		return false // 1xx (and nonsense) go to http.ReadResponse
	}
	keepAlive := false
	for len(rest) > 2 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !validName(name) || !validValue(value) {
			return false
		}
		value = trimOWS(value)
		switch {
		case equalFold(name, "Transfer-Encoding"), equalFold(name, "Trailer"):
			return false
		case equalFold(name, "Content-Length"):
			if h.contentLength >= 0 || len(value) == 0 || len(value) > 15 {
				return false
			}
			h.contentLength = 0
			for _, c := range value {
				if c < '0' || c > '9' {
					return false
				}
				h.contentLength = h.contentLength*10 + int64(c-'0')
			}
		case equalFold(name, "Content-Type"):
			if containsFold(value, "event-stream") {
				return false // flushed as it comes, by the other path
			}
		case equalFold(name, "Connection"):
			h.close = h.close || hasToken(value, "close")
			keepAlive = keepAlive || hasToken(value, "keep-alive")
			h.connection = append(h.connection, headerLine{name, value})
		case equalFold(name, "Date"):
			h.hasDate = true
		}
		h.headers = append(h.headers, headerLine{name, value})
	}
	if http10 && !keepAlive {
		h.close = true
	}
	bodyless := head || h.code == 204 || h.code == 304
	return bodyless || h.contentLength >= 0
}

// writeParsed answers the client with the head h, read from bc, and its body, as writeAnswer
// does, and returns bc to the pool when it stays usable. It reports whether the client
// connection can serve another request.
func (c *clientConn) writeParsed(h *respHead, bc *backendConn, a *answer) bool {
	if c.s.closing.Load() {
		a.keepAlive = false
	}
	b := appendStatusLine(c.scratch[:0], h.code)
	b = append(b, "\r\n"...)
	b = appendLines(b, h.headers, h.connection, skipHop)
	if !h.hasDate {
		b = append(b, "Date: "...)
		b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
		b = append(b, "\r\n"...)
	}
	b = a.endHead(b)
	c.scratch = b
	_, _ = bc.br.Discard(h.size)
	var n int64
	if !a.head && h.code != 204 && h.code != 304 {
		n = h.contentLength
	}
	if _, err := c.bw.Write(b); err != nil {
		bc.close()
		return false
	}
	if n > int64(bc.br.Buffered()) {
		bc.setReadDeadline(time.Time{}) // the body may take its time
	}
	if n > 0 {
		if _, err := io.CopyN(c.bw, bc.br, n); err != nil {
			bc.close()
			return false
		}
	}
	if h.close {
		bc.close()
	} else {
		c.s.proxy.pool.put(bc)
	}
	return c.bw.Flush() == nil
}

// containsFold reports whether b contains the ASCII string s, ignoring case.
func containsFold(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if equalFold(b[i:i+len(s)], s) {
			return true
		}
	}
	return false
}
