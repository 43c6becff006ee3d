package router

import (
	"bytes"
	"strconv"
)

// The request loop (loop.go) parses request heads itself, in place in the connection's read
// buffer, and only for the common request: GET or HEAD over HTTP/1.0 or 1.1 with an
// origin-form target, one plain Host, and no body, upgrade or Expect. parseHead refuses
// everything else, and net/http's server then serves the connection, with its own checks and
// answers (400, 431 and so on).

// reqHead is one parsed request head; its slices point into the connection's read buffer and
// are valid until the head is discarded.
type reqHead struct {
	method, uri, host []byte
	http10            bool
	keepAlive         bool // the client wants the connection kept (by its version and Connection)
	teTrailers        bool // Te names trailers
	headers           []headerLine
	connection        []headerLine // the Connection headers
	size              int          // bytes of the head, with its blank line
}

// headerLine is one header field of a head.
type headerLine struct{ name, value []byte }

// headEnd is the length of the head at the start of buf (up to and including its blank line),
// 0 when buf holds no complete head, or -1 when buf cannot start a head the loop parses (a
// leading empty line, or lines ended by a bare LF).
func headEnd(buf []byte) int {
	if len(buf) > 0 && (buf[0] == '\r' || buf[0] == '\n') {
		return -1
	}
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	head := buf // no end yet: what there is of the head
	if end >= 0 {
		end += 4
		head = buf[:end]
	}
	if bytes.Contains(head, []byte("\n\n")) {
		return -1
	}
	return max(end, 0)
}

// parseHead parses the complete head b (headEnd) into h and reports whether the loop may
// serve it; false leaves the request to net/http.
func parseHead(b []byte, h *reqHead) bool {
	*h = reqHead{headers: h.headers[:0], connection: h.connection[:0], size: len(b)}
	line, rest, _ := bytes.Cut(b, []byte("\r\n"))
	method, line, ok1 := bytes.Cut(line, []byte(" "))
	uri, proto, ok2 := bytes.Cut(line, []byte(" "))
	if !ok1 || !ok2 {
		return false
	}
	switch string(method) {
	case "GET", "HEAD":
	default:
		return false
	}
	switch string(proto) {
	case "HTTP/1.1":
	case "HTTP/1.0":
		h.http10 = true
	default:
		return false
	}
	if !plainURI(uri) {
		return false
	}
	h.method, h.uri = method, uri
	hosts := 0
	closeConn, keepAlive := false, false
	for len(rest) > 2 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !validName(name) || !validValue(value) {
			return false // also obs-fold: a continuation line's name starts with a space
		}
		value = trimOWS(value)
		switch {
		case equalFold(name, "Host"):
			hosts++
			h.host = value
			continue
		case equalFold(name, "Content-Length"), equalFold(name, "Transfer-Encoding"),
			equalFold(name, "Upgrade"), equalFold(name, "Expect"):
			return false
		case equalFold(name, "Connection"):
			closeConn = closeConn || hasToken(value, "close")
			keepAlive = keepAlive || hasToken(value, "keep-alive")
			h.connection = append(h.connection, headerLine{name, value})
		case equalFold(name, "Te"):
			h.teTrailers = h.teTrailers || hasToken(value, "trailers")
		}
		h.headers = append(h.headers, headerLine{name, value})
	}
	if hosts != 1 || !validHost(h.host) {
		return false
	}
	if h.http10 {
		h.keepAlive = keepAlive && !closeConn
	} else {
		h.keepAlive = !closeConn
	}
	return true
}

// plainURI reports whether uri is an origin-form target that ReverseProxy would send on
// byte for byte: a path of characters a URL's escaped path keeps as they are, with valid
// escapes, and a plainQuery.
func plainURI(uri []byte) bool {
	if len(uri) == 0 || uri[0] != '/' {
		return false
	}
	path, query, _ := bytes.Cut(uri, []byte("?"))
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case bytes.IndexByte([]byte("-._~!$&'()*+,;=:@/"), c) >= 0:
		case c == '%':
			if i+2 >= len(path) || !isHex(path[i+1]) || !isHex(path[i+2]) {
				return false
			}
		default:
			return false
		}
	}
	for _, c := range query {
		if c <= ' ' || c >= 0x7f || c == '#' {
			return false
		}
	}
	return plainQuery(string(query))
}

// validHost reports whether a Host value is one the loop serves: a name or address, with an
// optional port (anything else goes to net/http, which checks it).
func validHost(h []byte) bool {
	if len(h) == 0 {
		return false
	}
	for _, c := range h {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' || c == '.' || c == ':' || c == '[' || c == ']' || c == '_':
		default:
			return false
		}
	}
	return true
}

// validName reports whether b is a header name (an RFC 9110 token).
func validName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTokenChar(c) {
			return false
		}
	}
	return true
}

// isTokenChar reports whether c may appear in an RFC 9110 token.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
}

// validValue reports whether b is a header value net/http accepts: no control bytes but tab.
func validValue(b []byte) bool {
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// trimOWS removes leading and trailing spaces and tabs.
func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// equalFold reports whether b equals the ASCII string s, ignoring case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		if lower(b[i]) != lower(s[i]) {
			return false
		}
	}
	return true
}

// lower is c in lower case (ASCII).
func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// hasToken reports whether the comma-separated value v holds token, ignoring case.
func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var t []byte
		t, v, _ = bytes.Cut(v, []byte(","))
		if equalFold(trimOWS(t), token) {
			return true
		}
	}
	return false
}

// skipForwarded reports whether the request header name is not forwarded as it is: a
// hop-by-hop header, one the client's Connection headers name, or one the router sets.
func skipForwarded(name []byte, connection []headerLine) bool {
	for _, k := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		if equalFold(name, k) {
			return true
		}
	}
	return skipHop(name, connection)
}

// skipHop reports whether the header name is hop-by-hop: a standard one, or one the
// Connection headers name.
func skipHop(name []byte, connection []headerLine) bool {
	for _, k := range hopHeaders {
		if equalFold(name, k) {
			return true
		}
	}
	for _, c := range connection {
		if hasToken(c.value, string(name)) {
			return true
		}
	}
	return false
}

// appendLines appends the header lines to b with canonical names, leaving out those skip
// says to (skipForwarded for a request, skipHop for an answer) given the Connection headers.
func appendLines(b []byte, lines, connection []headerLine, skip func(name []byte, connection []headerLine) bool) []byte {
	for _, l := range lines {
		if skip(l.name, connection) {
			continue
		}
		b = appendCanonical(b, l.name)
		b = append(b, ": "...)
		b = append(b, l.value...)
		b = append(b, "\r\n"...)
	}
	return b
}

// appendRequest appends to out the request h as the direct path sends it (writeRequest): the
// client's method, target and Host, its headers with canonical names and without hop-by-hop
// ones, Te: trailers when the client accepts trailers, X-Forwarded-For (the client's values,
// then peerIP), X-Forwarded-Host and X-Forwarded-Proto.
func appendRequest(out []byte, h *reqHead, peerIP string, tls bool) []byte {
	out = append(out, h.method...)
	out = append(out, ' ')
	out = append(out, h.uri...)
	out = append(out, " HTTP/1.1\r\nHost: "...)
	out = append(out, h.host...)
	out = append(out, "\r\n"...)
	out = appendLines(out, h.headers, h.connection, skipForwarded)
	if h.teTrailers {
		out = append(out, "Te: trailers\r\n"...)
	}
	if peerIP != "" {
		out = append(out, "X-Forwarded-For: "...)
		for _, l := range h.headers {
			if equalFold(l.name, "X-Forwarded-For") {
				out = append(out, l.value...)
				out = append(out, ", "...)
			}
		}
		out = append(out, peerIP...)
		out = append(out, "\r\n"...)
	}
	out = append(out, "X-Forwarded-Host: "...)
	out = append(out, h.host...)
	if tls {
		return append(out, "\r\nX-Forwarded-Proto: https\r\n\r\n"...)
	}
	return append(out, "\r\nX-Forwarded-Proto: http\r\n\r\n"...)
}

// appendCanonical appends the header name b in net/http's canonical form (X-Forwarded-For).
func appendCanonical(out, b []byte) []byte {
	upper := true
	for _, c := range b {
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		out = append(out, c)
		upper = c == '-'
	}
	return out
}

// appendStatusLine appends an HTTP/1.1 status line for code.
func appendStatusLine(out []byte, code int) []byte {
	out = append(out, "HTTP/1.1 "...)
	out = strconv.AppendInt(out, int64(code), 10)
	out = append(out, ' ')
	return append(out, statusText(code)...)
}
