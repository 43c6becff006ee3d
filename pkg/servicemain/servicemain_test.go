package servicemain

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

type testConfig struct {
	Listen string `json:"listen"`
}

func (c *testConfig) LoadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if strings.Contains(string(b), "file") {
		c.Listen = "from-file"
	}
	return nil
}

func (c *testConfig) Validate() error {
	if c.Listen == "" {
		return errors.New("listen: required")
	}
	return nil
}

func TestParse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(`{"listen":"file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, want, wantErr string
		args                []string
	}{
		{name: "flag", args: []string{"-listen", "x:1"}, want: "x:1"},
		{name: "file", args: []string{"-config", path}, want: "from-file"},
		{name: "flag overrides file", args: []string{"-config", path, "-listen", "y:2"}, want: "y:2"},
		{name: "invalid", args: nil, wantErr: "invalid configuration: listen: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg testConfig
			fs := NewFlagSet("svc")
			fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "listen address")
			err := Parse(fs, tt.args, &cfg)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Parse error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Listen != tt.want {
				t.Fatalf("listen = %q, want %q", cfg.Listen, tt.want)
			}
		})
	}
	if u := NewFlagSet("svc").Lookup("config").Usage; !strings.Contains(u, "services/svc/README.md") {
		t.Fatalf("config usage %q does not name the service README", u)
	}
}

// listener is a Service that listens on loopback until its context ends.
type listener struct{ ln net.Listener }

func (l *listener) Run(ctx context.Context, ready func()) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	l.ln = ln
	ready()
	<-ctx.Done()
	return ln.Close()
}

func (l *listener) Addr() net.Addr { return l.ln.Addr() }

// lines is an io.Writer handing each log line to the test; it holds up to 64 unread lines.
type lines chan string

func (l lines) Write(p []byte) (int, error) {
	l <- string(p)
	return len(p), nil
}

func TestServeLogsAddressOnceReady(t *testing.T) {
	out := make(lines, 64)
	logger := hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Info})
	svc := &listener{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, logger, "svc", svc, "extra", "v") }()
	var line string
	for !strings.Contains(line, "svc serving") {
		select {
		case line = <-out:
		case err := <-done:
			t.Fatalf("Serve returned before ready: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("no serving line within 30s")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if !strings.Contains(line, "address="+svc.Addr().String()) || !strings.Contains(line, "extra=v") {
		t.Fatalf("serving line %q lacks the address or the fields", line)
	}
}
