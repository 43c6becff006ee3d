package router

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

const (
	tcpProto = routeemitterv1.Route_PROTOCOL_TCP
	udpProto = routeemitterv1.Route_PROTOCOL_UDP
)

// tcpEcho starts a TCP server on loopback that greets each connection with "<name>\n", echoes
// what it reads, and closes its side once the client half-closes.
func tcpEcho(t testing.TB, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.WriteString(c, name+"\n"); err != nil {
					return
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// dialTCP connects to the router's incoming port and reads the backend's greeting.
func dialTCP(t testing.TB, port uint32) (*net.TCPConn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))), 5*time.Second)
	if err != nil {
		t.Fatalf("dial incoming port %d: %v", port, err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	greeting, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("read greeting through port %d: %v", port, err)
	}
	return c.(*net.TCPConn), br, strings.TrimSpace(greeting)
}

func TestTCPEchoRoundRobinAndHalfClose(t *testing.T) {
	a, b := tcpEcho(t, "a"), tcpEcho(t, "b")
	port := uint32(testkit.ReservedPort(t))
	fake := startFake(t, "127.0.0.1:0", "t1", portRoute(tcpProto, port, a, b))
	r := startRouter(t, testConfig(fake.addr))
	testkit.Eventually(t, 10*time.Second, func() bool { return r.TCPAddr(port) != nil }, "tcp port open")

	var names []string
	for i := 0; i < 4; i++ {
		c, br, name := dialTCP(t, port)
		names = append(names, name)
		msg := "hello " + strconv.Itoa(i)
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		// Half-close: the backend sees EOF, its echo still comes back, then EOF.
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(br)
		if err != nil {
			t.Fatalf("read echo: %v", err)
		}
		if string(rest) != msg {
			t.Fatalf("echo = %q, want %q", rest, msg)
		}
	}
	if strings.Join(names, ",") != "a,b,a,b" && strings.Join(names, ",") != "b,a,b,a" {
		t.Fatalf("connections went to %v, want round-robin", names)
	}
}

func TestTCPRouteRemovalClosesListenerAndConnections(t *testing.T) {
	a := tcpEcho(t, "a")
	port := uint32(testkit.ReservedPort(t))
	fake := startFake(t, "127.0.0.1:0", "t1", portRoute(tcpProto, port, a))
	r := startRouter(t, testConfig(fake.addr))
	testkit.Eventually(t, 10*time.Second, func() bool { return r.TCPAddr(port) != nil }, "tcp port open")
	c, br, _ := dialTCP(t, port)
	if _, err := io.WriteString(c, "x\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "x\n" {
		t.Fatalf("echo before removal: %q %v", line, err)
	}

	fake.remove(portRoute(tcpProto, port))
	testkit.Eventually(t, 10*time.Second, func() bool { return r.TCPAddr(port) == nil }, "tcp port closed")
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	var ne net.Error
	if _, err := br.ReadString('\n'); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("open connection after removal: read err %v, want it closed", err)
	}
	if c2, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))), time.Second); err == nil {
		c2.Close()
		t.Fatal("incoming port still accepts connections after the route was removed")
	}
}

func TestTCPEndpointChangeAppliesToNewConnections(t *testing.T) {
	a, b := tcpEcho(t, "a"), tcpEcho(t, "b")
	port := uint32(testkit.ReservedPort(t))
	fake := startFake(t, "127.0.0.1:0", "t1", portRoute(tcpProto, port, a))
	r := startRouter(t, testConfig(fake.addr))
	testkit.Eventually(t, 10*time.Second, func() bool { return r.TCPAddr(port) != nil }, "tcp port open")
	old, oldBr, name := dialTCP(t, port)
	if name != "a" {
		t.Fatalf("first connection reached %q", name)
	}
	v := fake.upsert(portRoute(tcpProto, port, b))
	waitVersion(t, r, "t1", v)
	if _, _, name := dialTCP(t, port); name != "b" {
		t.Fatalf("new connection after the change reached %q, want b", name)
	}
	// The existing connection keeps its endpoint.
	if _, err := io.WriteString(old, "still\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := oldBr.ReadString('\n'); err != nil || line != "still\n" {
		t.Fatalf("old connection: %q %v", line, err)
	}
}

// udpEcho starts a UDP server on loopback that answers each datagram with "<name>:<datagram>".
func udpEcho(t testing.TB, name string) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteTo(append([]byte(name+":"), buf[:n]...), from)
		}
	}()
	return c.LocalAddr().String()
}

// udpAsk sends msg from c to the router's port and returns the answer.
func udpAsk(t testing.TB, c *net.UDPConn, msg string) string {
	t.Helper()
	buf := make([]byte, 2048)
	for attempt := 0; attempt < 5; attempt++ {
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n])
		}
	}
	t.Fatalf("no UDP answer to %q", msg)
	return ""
}

func TestUDPEchoSessions(t *testing.T) {
	a, b := udpEcho(t, "a"), udpEcho(t, "b")
	port := uint32(testkit.ReservedPort(t))
	fake := startFake(t, "127.0.0.1:0", "t1", portRoute(udpProto, port, a, b))
	cfg := testConfig(fake.addr)
	cfg.UDPSessionIdleTimeout = Duration(300 * time.Millisecond)
	r := startRouter(t, cfg)
	testkit.Eventually(t, 10*time.Second, func() bool { return r.UDPAddr(port) != nil }, "udp port open")

	raddr := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(port)}
	c1, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()

	first := udpAsk(t, c1, "one")
	if first != "a:one" && first != "b:one" {
		t.Fatalf("answer %q", first)
	}
	// A client keeps its session's endpoint.
	if got := udpAsk(t, c1, "two"); got[:1] != first[:1] {
		t.Fatalf("same client switched endpoint: %q then %q", first, got)
	}
	// The next client's session goes to the other endpoint.
	if got := udpAsk(t, c2, "three"); got[:1] == first[:1] {
		t.Fatalf("second client got %q, want the other endpoint than %q", got, first)
	}
	l, _ := r.udp.get(port)
	sessions := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.sessions)
	}
	if n := sessions(); n != 2 {
		t.Fatalf("%d sessions, want 2", n)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return sessions() == 0 }, "idle sessions to end")
	if got := udpAsk(t, c1, "again"); !strings.HasSuffix(got, ":again") {
		t.Fatalf("after expiry: %q", got)
	}

	fake.remove(portRoute(udpProto, port))
	testkit.Eventually(t, 10*time.Second, func() bool { return r.UDPAddr(port) == nil }, "udp port closed")
}

// TestIncomingPortRange: the router opens TCP and UDP incoming ports only inside
// incoming_port_range; a route on a port outside it is refused and never opened.
func TestIncomingPortRange(t *testing.T) {
	backend := tcpEcho(t, "a")
	inside, outside := uint32(testkit.ReservedPort(t)), uint32(testkit.ReservedPort(t))
	outsideUDP := uint32(testkit.ReservedPort(t))
	fake := startFake(t, "127.0.0.1:0", "t1",
		portRoute(tcpProto, inside, backend), portRoute(tcpProto, outside, backend), portRoute(udpProto, outsideUDP, backend))
	cfg := testConfig(fake.addr)
	cfg.IncomingPortRange = strconv.Itoa(int(inside)) + "-" + strconv.Itoa(int(inside))
	r := startRouter(t, cfg)
	testkit.Eventually(t, 10*time.Second, func() bool { return r.TCPAddr(inside) != nil }, "the tcp port inside the range open")
	// The same reconcile pass refused the others.
	if r.TCPAddr(outside) != nil {
		t.Fatalf("tcp port %d outside %s was opened", outside, cfg.IncomingPortRange)
	}
	if r.UDPAddr(outsideUDP) != nil {
		t.Fatalf("udp port %d outside %s was opened", outsideUDP, cfg.IncomingPortRange)
	}
	if _, _, name := dialTCP(t, inside); name != "a" {
		t.Fatalf("greeting %q through the open port", name)
	}
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(outside))), time.Second); err == nil {
		c.Close()
		t.Fatalf("port %d outside the range accepts connections", outside)
	}
}
