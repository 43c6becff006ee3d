package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gavel-sched/gavel/internal/testkit"
)

// TestMain runs the app itself when the test binary is started as the app (see startHello).
func TestMain(m *testing.M) {
	if os.Getenv("HELLO_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestBindsTheGivenAddress starts the app the way the rep's process backend does (PORT,
// PORT_<container port>, CF_INSTANCE_IP) with an HTTP, a TCP echo and a UDP echo port, and
// checks each answers on the given address and is bound nowhere else: 127.0.0.1 (or, without
// CF_INSTANCE_IP, 127.0.0.2) refuses connections, and the same ports there are free to bind.
func TestBindsTheGivenAddress(t *testing.T) {
	tests := []struct {
		name        string
		instanceIP  string // CF_INSTANCE_IP; empty: unset
		bound, free string
	}{
		{"the address it is given", "127.0.0.2", "127.0.0.2", "127.0.0.1"},
		{"loopback without one", "", "127.0.0.1", "127.0.0.2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first, _ := testkit.PortBlock(t, 3)
			httpPort, tcpPort, udpPort := strconv.Itoa(first), strconv.Itoa(first+1), strconv.Itoa(first+2)
			env := []string{
				"PORT=" + httpPort, "PORT_8080=" + httpPort, "PORT_9000=" + tcpPort, "PORT_9001=" + udpPort,
				"TCP_ECHO_PORTS=9000", "UDP_ECHO_PORTS=9001", "INSTANCE_INDEX=3", "INSTANCE_GUID=g-3",
			}
			if tt.instanceIP != "" {
				env = append(env, "CF_INSTANCE_IP="+tt.instanceIP)
			}
			startHello(t, env)

			// HTTP answers on the bound address.
			client := &http.Client{Timeout: 10 * time.Second}
			resp, err := client.Get("http://" + net.JoinHostPort(tt.bound, httpPort) + "/")
			if err != nil {
				t.Fatalf("GET on %s: %v", tt.bound, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasPrefix(string(body), "hello from instance 3 (guid g-3") {
				t.Errorf("GET on %s answered %q", tt.bound, body)
			}
			// TCP echo on the bound address.
			conn, err := net.Dial("tcp", net.JoinHostPort(tt.bound, tcpPort))
			if err != nil {
				t.Fatalf("dial the TCP echo on %s: %v", tt.bound, err)
			}
			echo(t, conn, "tcp ping")
			// UDP echo on the bound address.
			uc, err := net.Dial("udp", net.JoinHostPort(tt.bound, udpPort))
			if err != nil {
				t.Fatalf("dial the UDP echo on %s: %v", tt.bound, err)
			}
			echo(t, uc, "udp ping")

			// Nothing on the other address: connections are refused and its ports are free.
			for _, p := range []string{httpPort, tcpPort} {
				if c, err := net.Dial("tcp", net.JoinHostPort(tt.free, p)); err == nil {
					c.Close()
					t.Errorf("port %s answers on %s too", p, tt.free)
				}
				l, err := net.Listen("tcp", net.JoinHostPort(tt.free, p))
				if err != nil {
					t.Errorf("TCP port %s is taken on %s too (bound to every interface?): %v", p, tt.free, err)
				} else {
					l.Close()
				}
			}
			pc, err := net.ListenPacket("udp", net.JoinHostPort(tt.free, udpPort))
			if err != nil {
				t.Errorf("UDP port %s is taken on %s too (bound to every interface?): %v", udpPort, tt.free, err)
			} else {
				pc.Close()
			}
		})
	}
}

// startHello runs the app (this test binary, see TestMain) with env and returns once it has
// bound every port (it logs "serving" after that); it is killed when the test ends.
func startHello(t *testing.T, env []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, "HELLO_RUN_MAIN=1")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(stderr)
	var seen []string
	for sc.Scan() {
		seen = append(seen, sc.Text())
		if strings.Contains(sc.Text(), "serving") {
			go func() { _, _ = io.Copy(io.Discard, stderr) }()
			return
		}
	}
	t.Fatalf("hello exited before serving: %v\n%s", sc.Err(), strings.Join(seen, "\n"))
}

// echo sends msg on conn and expects it back.
func echo(t *testing.T, conn net.Conn, msg string) {
	t.Helper()
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(msg)); err != nil {
		t.Fatalf("echo %s: write: %v", conn.RemoteAddr(), err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo %s: got %q, %v; want %q", conn.RemoteAddr(), buf, err, msg)
	}
}
