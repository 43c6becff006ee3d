// Command linkclient is Gavel's sample link consumer: it serves HTTP on $PORT and, on every
// GET /, reads the file of its link ($GAVEL_LINKS_DIR/$LINK_NAME.json, LINK_NAME defaulting to
// "backend"), connects to every node's address over HTTP and answers with what each said:
//
//	{"link": {"nodes": [...], "properties": {...}}, "answers": [{"address", "answer" | "error"}],
//	 "env": <GAVEL_LINKS as given at start>, "hups": <SIGHUPs received>}
//
// It is built static so it runs on a cell's host or in a preloaded rootfs.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

type node struct {
	Name    string `json:"name"`
	ID      string `json:"id"`
	Index   int32  `json:"index"`
	AZ      string `json:"az"`
	Address string `json:"address"`
}

type link struct {
	Nodes      []node            `json:"nodes"`
	Properties map[string]string `json:"properties"`
}

type answer struct {
	Address string `json:"address"`
	Answer  string `json:"answer,omitempty"`
	Error   string `json:"error,omitempty"`
}

type report struct {
	Link    link            `json:"link"`
	Answers []answer        `json:"answers"`
	Env     json.RawMessage `json:"env,omitempty"`
	Hups    int64           `json:"hups"`
}

func main() {
	name := os.Getenv("LINK_NAME")
	if name == "" {
		name = "backend"
	}
	file := filepath.Join(os.Getenv("GAVEL_LINKS_DIR"), name+".json")
	var hups atomic.Int64
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGHUP)
		for range sig {
			hups.Add(1)
		}
	}()
	client := &http.Client{Timeout: 2 * time.Second}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		rep := report{Hups: hups.Load()}
		if env := os.Getenv("GAVEL_LINKS"); env != "" {
			rep.Env = json.RawMessage(env)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := json.Unmarshal(b, &rep.Link); err != nil {
			http.Error(w, fmt.Sprintf("parse %s: %v", file, err), http.StatusInternalServerError)
			return
		}
		for _, n := range rep.Link.Nodes {
			a := answer{Address: n.Address}
			resp, err := client.Get("http://" + n.Address + "/")
			if err != nil {
				a.Error = err.Error()
			} else {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				a.Answer = strings.TrimSpace(string(body))
			}
			rep.Answers = append(rep.Answers, a)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rep)
	})
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	log.Printf("linkclient: link file %s, serving on :%s", file, port)
	go func() { log.Fatal(http.ListenAndServe(":"+port, mux)) }()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
