// Command httpserver is the test app: it serves HTTP on $PORT and on every $PORT_<n>, on every
// interface, or only on $CF_INSTANCE_IP when $BIND_INSTANCE_IP is set.
//
//	GET /        JSON: the environment, "uid", "cwd" and "resolv" (whether /etc/resolv.conf exists)
//	GET /health  200, or 500 while the file $HEALTH_FAIL_FILE exists
//	GET /ready   200, or 500 while the file $READY_FAIL_FILE exists
//
// When the file $CLOSE_FILE appears, it closes its listeners and keeps running.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	ports := map[string]bool{}
	if p := os.Getenv("PORT"); p != "" {
		ports[p] = true
	}
	for _, kv := range os.Environ() {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PORT_") {
			ports[v] = true
		}
	}
	if len(ports) == 0 {
		fmt.Fprintln(os.Stderr, "no PORT")
		os.Exit(2)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		out := map[string]string{}
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			out[k] = v
		}
		out["uid"] = fmt.Sprint(os.Getuid())
		out["cwd"], _ = os.Getwd()
		_, err := os.Stat("/etc/resolv.conf")
		out["resolv"] = fmt.Sprint(err == nil)
		_ = json.NewEncoder(w).Encode(out)
	})
	failWhile := func(env string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if f := os.Getenv(env); f != "" {
				if _, err := os.Stat(f); err == nil {
					http.Error(w, "failing", http.StatusInternalServerError)
					return
				}
			}
			fmt.Fprintln(w, "ok")
		}
	}
	mux.HandleFunc("/health", failWhile("HEALTH_FAIL_FILE"))
	mux.HandleFunc("/ready", failWhile("READY_FAIL_FILE"))

	host := "0.0.0.0"
	if os.Getenv("BIND_INSTANCE_IP") != "" {
		host = os.Getenv("CF_INSTANCE_IP")
	}
	var listeners []net.Listener
	for p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(host, p))
		if err != nil {
			fmt.Fprintln(os.Stderr, "listen:", err)
			os.Exit(1)
		}
		listeners = append(listeners, l)
		go func() { _ = http.Serve(l, mux) }()
	}
	closeFile := os.Getenv("CLOSE_FILE")
	for {
		time.Sleep(50 * time.Millisecond)
		if closeFile == "" {
			continue
		}
		if _, err := os.Stat(closeFile); err == nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			closeFile = ""
		}
	}
}
