package router

import (
	"strings"
	"testing"
)

func TestParseHeadServesOnlyTheCommonRequest(t *testing.T) {
	for _, tc := range []struct {
		head      string
		ok        bool
		keepAlive bool
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", true, true},
		{"HEAD /x?y=1 HTTP/1.1\r\nHost: a:80\r\nConnection: close\r\n\r\n", true, false},
		{"GET / HTTP/1.0\r\nHost: a\r\n\r\n", true, false},
		{"GET / HTTP/1.0\r\nHost: a\r\nConnection: Keep-Alive\r\n\r\n", true, true},
		{"GET /a%2Fb HTTP/1.1\r\nHost: a\r\nX: \t v \r\n\r\n", true, true},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\n\r\n", false, false},                       // no Host
		{"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", false, false}, // two
		{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", false, false},
		{"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", false, false},
		{"GET /a;b?c=d;e HTTP/1.1\r\nHost: a\r\n\r\n", false, false}, // ReverseProxy re-encodes the query
		{"GET /%zz HTTP/1.1\r\nHost: a\r\n\r\n", false, false},
		{"GET /a\"b HTTP/1.1\r\nHost: a\r\n\r\n", false, false},
		{"GET / HTTP/2.0\r\nHost: a\r\n\r\n", false, false},
		{"PRI * HTTP/2.0\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n folded\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\nHost: a\r\nBad Name: 1\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n", false, false},
	} {
		var h reqHead
		if got := parseHead([]byte(tc.head), &h); got != tc.ok || got && h.keepAlive != tc.keepAlive {
			t.Errorf("%q: served %v keep-alive %v, want %v %v", tc.head, got, h.keepAlive, tc.ok, tc.keepAlive)
		}
	}
}

func TestHeadEnd(t *testing.T) {
	for _, tc := range []struct {
		buf  string
		want int
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest\n\n", 27},
		{"GET / HTTP/1.1\r\nHost: a\r\n", 0},
		{"GET / HTTP/1.1\nHost: a\n\n", -1},
		{"\r\nGET / HTTP/1.1\r\n\r\n", -1},
	} {
		if got := headEnd([]byte(tc.buf)); got != tc.want {
			t.Errorf("headEnd(%q) = %d, want %d", tc.buf, got, tc.want)
		}
	}
}

func TestAppendRequestMatchesTheDirectPath(t *testing.T) {
	var h reqHead
	head := "GET /p?q=1 HTTP/1.1\r\nHost: App.example.com\r\nx-one: 1\r\nConnection: keep-alive, X-Drop\r\n" +
		"X-Drop: d\r\nTe: trailers, gzip\r\nX-Forwarded-For: 10.0.0.1\r\nForwarded: for=x\r\nKeep-Alive: 5\r\n\r\n"
	if !parseHead([]byte(head), &h) {
		t.Fatal("not parsed")
	}
	got := string(appendRequest(nil, &h, "127.0.0.1", true))
	want := "GET /p?q=1 HTTP/1.1\r\nHost: App.example.com\r\nX-One: 1\r\nTe: trailers\r\n" +
		"X-Forwarded-For: 10.0.0.1, 127.0.0.1\r\nX-Forwarded-Host: App.example.com\r\nX-Forwarded-Proto: https\r\n\r\n"
	if got != want {
		t.Fatalf("request\n%q\nwant\n%q", got, want)
	}
	if key := string(appendRouteKey(nil, []byte("App.Example.com.:8080"))); key != "app.example.com" {
		t.Fatalf("route key %q", key)
	}
	if key := string(appendRouteKey(nil, []byte("[::1]"))); key != "[::1]" {
		t.Fatalf("IPv6 route key %q", key)
	}
}

func TestParseRespHeadTakesOnlyFramedFinalAnswers(t *testing.T) {
	for _, tc := range []struct {
		head   string
		isHEAD bool
		ok     bool
		close  bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false, true, false},
		{"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", false, true, true},
		{"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n", false, true, true},
		{"HTTP/1.1 204 No Content\r\n\r\n", false, true, false},
		{"HTTP/1.1 200 OK\r\n\r\n", true, true, false},
		{"HTTP/1.1 200 OK\r\n\r\n", false, false, false}, // ends with the connection
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", false, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTrailer: X\r\n\r\n", false, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", false, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: Text/Event-Stream\r\n\r\n", false, false, false},
		{"HTTP/1.1 100 Continue\r\n\r\n", false, false, false},
		{"HTTP/1.1 2000 OK\r\nContent-Length: 5\r\n\r\n", false, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false, false, false},
	} {
		var h respHead
		if got := parseRespHead([]byte(tc.head), tc.isHEAD, &h); got != tc.ok || got && h.close != tc.close {
			t.Errorf("%q (HEAD %v): taken %v close %v, want %v %v", tc.head, tc.isHEAD, got, h.close, tc.ok, tc.close)
		}
	}
	var h respHead
	if !parseRespHead([]byte("HTTP/1.1 200 OK\r\nContent-Length: 123\r\n"+strings.Repeat("X-A: b\r\n", 3)+"\r\n"), false, &h) ||
		h.contentLength != 123 || len(h.headers) != 4 {
		t.Fatalf("parsed %+v", h)
	}
}
