package bbsclient

import (
	"context"
	"encoding/json"
	"flag"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// TestBBSTargets checks that bbs_address may list several BBS instances and that bbs_addresses
// replaces it.
func TestBBSTargets(t *testing.T) {
	for _, tc := range []struct {
		address string
		list    []string
		want    []string
	}{
		{"bbs:8889", nil, []string{"bbs:8889"}},
		{"bbs-0:8889, bbs-1:8889", nil, []string{"bbs-0:8889", "bbs-1:8889"}},
		{"127.0.0.1:8889", []string{"a:1", "b:2"}, []string{"a:1", "b:2"}},
		{"", nil, nil},
	} {
		c := Default()
		c.BBSAddress, c.BBSAddresses = tc.address, tc.list
		if got := c.BBSTargets(); !slices.Equal(got, tc.want) {
			t.Errorf("BBSTargets(%q, %q) = %q, want %q", tc.address, tc.list, got, tc.want)
		}
	}
}

func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{"valid", Config{BBSAddress: "bbs:8889", BBSTLS: tlsx.Config{Insecure: true}}, ""},
		{"no address", Config{BBSTLS: tlsx.Config{Insecure: true}}, "bbs_address"},
		{"no tls", Config{BBSAddress: "bbs:8889"}, "bbs_tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.want)
			}
			if _, err := Dial(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Dial = %v, want the validation error", err)
			}
		})
	}
}

// TestEmbeddedJSONAndFlags checks that a service configuration embedding Config reads the BBS
// fields at its top level, and that Flags binds them.
func TestEmbeddedJSONAndFlags(t *testing.T) {
	var svc struct {
		Config
		ListenAddress string `json:"listen_address"`
	}
	doc := `{"listen_address": ":1", "bbs_addresses": ["a:1", "b:2"], "bbs_tls": {"insecure": true}}`
	if err := json.Unmarshal([]byte(doc), &svc); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(svc.BBSTargets(), []string{"a:1", "b:2"}) || !svc.BBSTLS.Insecure || svc.ListenAddress != ":1" {
		t.Fatalf("decoded %+v", svc)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c := Default()
	Flags(fs, &c)
	if err := fs.Parse([]string{"-bbs-address", "x:1,y:2", "-bbs-insecure", "-bbs-server-name", "bbs.internal"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.BBSTargets(), []string{"x:1", "y:2"}) || !c.BBSTLS.Insecure || c.BBSTLS.ServerName != "bbs.internal" {
		t.Fatalf("flags gave %+v", c)
	}
}

// TestDialSkipsADownInstance dials two BBS addresses, one of which nothing serves: calls reach
// the one that answers.
func TestDialSkipsADownInstance(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := down.Addr().String()
	down.Close() // nothing serves it: its connection fails and is skipped

	conn, err := Dial(Config{BBSAddresses: []string{downAddr, l.Addr().String()}, BBSTLS: tlsx.Config{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
	}
}
