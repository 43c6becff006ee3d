// Command hello is Gavel's sample app: an HTTP server on $PORT (and on every $PORT_<n> a Gavel
// cell sets) that says which instance answered. Container ports listed in TCP_ECHO_PORTS or
// UDP_ECHO_PORTS (comma-separated) echo TCP or UDP instead. It is built static so it runs on a
// cell's host, in a preloaded rootfs, or from a FROM-scratch image.
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
)

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
	for host, container := range ports {
		addr := ":" + host
		switch {
		case tcpEcho[container]:
			go serveTCPEcho(addr)
		case udpEcho[container]:
			go serveUDPEcho(addr)
		default:
			go serveHTTP(addr, container, index, guid)
		}
	}
	log.Printf("hello: instance %s (%s) serving %v", index, guid, ports)
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

func serveHTTP(addr, containerPort, index, guid string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from instance %s (guid %s, pid %d) on container port %s, host %s, path %s\n", index, guid, os.Getpid(), containerPort, r.Host, r.URL.Path)
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	log.Fatal(http.ListenAndServe(addr, mux))
}

func serveTCPEcho(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
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

func serveUDPEcho(addr string) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 64*1024)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			log.Fatal(err)
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}
