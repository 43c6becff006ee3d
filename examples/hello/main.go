// Command hello is Gavel's sample app: an HTTP server on $PORT (and on every $PORT_<n> a Gavel
// cell sets) that says which instance answered. Container ports listed in TCP_ECHO_PORTS or
// UDP_ECHO_PORTS (comma-separated) echo TCP or UDP instead. It is built static so it runs on a
// cell's host, in a preloaded rootfs, or from a FROM-scratch image.
//
// $RELEASE, when set, is named in every answer (so a rollout can be followed through the
// router), and $READY_DELAY (a Go duration) makes /health answer 503 for that long after start,
// like an app that takes a while to become ready.
//
// It binds only the address it is given: $CF_INSTANCE_INTERNAL_IP (the container's own
// address the rep's oci backend sets), else $CF_INSTANCE_IP (the cell address the process
// backend sets, where the instance is routed to and checked), else 127.0.0.1: with no network
// namespace, listening on every interface would expose the instance on addresses the cell
// never advertised. It binds every port before it logs "serving".
package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// start is when the process started (READY_DELAY counts from it).
var start = time.Now()

func main() {
	index, guid := os.Getenv("INSTANCE_INDEX"), os.Getenv("INSTANCE_GUID")
	tcpEcho, udpEcho := set(os.Getenv("TCP_ECHO_PORTS")), set(os.Getenv("UDP_ECHO_PORTS"))
	ports := map[string]string{} // host port → container port
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if cp, ok := strings.CutPrefix(name, "PORT_"); ok {
			ports[value] = cp
		}
	}
	if p := os.Getenv("PORT"); p != "" {
		if _, ok := ports[p]; !ok {
			ports[p] = p
		}
	}
	if len(ports) == 0 {
		ports["8080"] = "8080"
	}
	ip := os.Getenv("CF_INSTANCE_INTERNAL_IP") // the container's own address (oci backend)
	if ip == "" {
		ip = os.Getenv("CF_INSTANCE_IP")
	}
	if ip == "" {
		ip = "127.0.0.1"
	}
	for host, container := range ports {
		addr := net.JoinHostPort(ip, host)
		switch {
		case tcpEcho[container]:
			l, err := net.Listen("tcp", addr)
			if err != nil {
				log.Fatal(err)
			}
			go serveTCPEcho(l)
		case udpEcho[container]:
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				log.Fatal(err)
			}
			go serveUDPEcho(pc)
		default:
			l, err := net.Listen("tcp", addr)
			if err != nil {
				log.Fatal(err)
			}
			go serveHTTP(l, container, index, guid)
		}
	}
	log.Printf("hello: instance %s (%s) serving on %s: %v", index, guid, ip, ports)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	log.Printf("hello: stopping")
}

func set(csv string) map[string]bool {
	out := map[string]bool{}
	for _, p := range strings.Split(csv, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out[p] = true
		}
	}
	return out
}

func serveHTTP(l net.Listener, containerPort, index, guid string) {
	release := ""
	if r := os.Getenv("RELEASE"); r != "" {
		release = ", release " + r
	}
	delay, _ := time.ParseDuration(os.Getenv("READY_DELAY"))
	readyAt := start.Add(delay)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from instance %s (guid %s, pid %d%s) on container port %s, host %s, path %s\n", index, guid, os.Getpid(), release, containerPort, r.Host, r.URL.Path)
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if time.Now().Before(readyAt) {
			http.Error(w, "not ready yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	log.Fatal(http.Serve(l, mux))
}

func serveTCPEcho(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

func serveUDPEcho(pc net.PacketConn) {
	buf := make([]byte, 64*1024)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			log.Fatal(err)
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}
