package tlsx

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "insecure", cfg: Config{Insecure: true}},
		{name: "insecure ignores files", cfg: Config{Insecure: true, CertFile: "x"}},
		{name: "complete", cfg: Config{CertFile: "a.crt", KeyFile: "a.key", CAFile: "ca.crt"}},
		{name: "empty", cfg: Config{}, wantErr: "CertFile"},
		{name: "missing key", cfg: Config{CertFile: "a.crt", CAFile: "ca.crt"}, wantErr: "KeyFile"},
		{name: "missing CA", cfg: Config{CertFile: "a.crt", KeyFile: "a.key"}, wantErr: "CAFile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error naming %s", err, tt.wantErr)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	cfgs, err := GenerateDevPKI(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	good := cfgs["server"]
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "invalid", cfg: Config{}, wantErr: "CertFile"},
		{name: "missing cert", cfg: Config{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: good.KeyFile, CAFile: good.CAFile}, wantErr: "load key pair"},
		{name: "missing CA", cfg: Config{CertFile: good.CertFile, KeyFile: good.KeyFile, CAFile: filepath.Join(dir, "nope.crt")}, wantErr: "read CA file"},
		{name: "CA not PEM", cfg: Config{CertFile: good.CertFile, KeyFile: good.KeyFile, CAFile: notPEM}, wantErr: "no PEM certificates"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.cfg.ServerTLS(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ServerTLS() = %v, want error containing %q", err, tt.wantErr)
			}
			if _, err := tt.cfg.ClientCredentials(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ClientCredentials() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestInsecure(t *testing.T) {
	cfg := Config{Insecure: true}
	if c, err := cfg.ServerTLS(); c != nil || err != nil {
		t.Errorf("ServerTLS() = %v, %v; want nil, nil", c, err)
	}
	if c, err := cfg.ClientTLS(); c != nil || err != nil {
		t.Errorf("ClientTLS() = %v, %v; want nil, nil", c, err)
	}
	for _, get := range []func() (credentials.TransportCredentials, error){cfg.ServerCredentials, cfg.ClientCredentials} {
		creds, err := get()
		if err != nil {
			t.Fatal(err)
		}
		if p := creds.Info().SecurityProtocol; p != "insecure" {
			t.Errorf("SecurityProtocol = %q, want insecure", p)
		}
	}
}

func TestGenerateDevPKI(t *testing.T) {
	dir := t.TempDir()
	first, err := GenerateDevPKI(dir, "bbs", "rep/cell-1")
	if err != nil {
		t.Fatal(err)
	}
	caBefore, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	second, err := GenerateDevPKI(dir, "auctioneer")
	if err != nil {
		t.Fatal(err)
	}
	caAfter, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if string(caBefore) != string(caAfter) {
		t.Fatal("second call replaced the existing CA")
	}
	if info, err := os.Stat(filepath.Join(dir, CAKeyFile)); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("ca.key mode = %v, %v; want 0600", info.Mode().Perm(), err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caAfter)

	tests := []struct {
		name   string
		cfg    Config
		wantID string
	}{
		{name: "bbs", cfg: first["bbs"], wantID: "spiffe://gavel/bbs"},
		{name: "rep/cell-1", cfg: first["rep/cell-1"], wantID: "spiffe://gavel/rep/cell-1"},
		{name: "auctioneer", cfg: second["auctioneer"], wantID: "spiffe://gavel/auctioneer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if want := filepath.Join(dir, filepath.FromSlash(tt.name)+".crt"); tt.cfg.CertFile != want {
				t.Errorf("CertFile = %s, want %s", tt.cfg.CertFile, want)
			}
			data, err := os.ReadFile(tt.cfg.CertFile)
			if err != nil {
				t.Fatal(err)
			}
			block, _ := pem.Decode(data)
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("verify for usage %v: %v", usage, err)
				}
			}
			for _, host := range []string{"localhost", "127.0.0.1", "::1"} {
				if err := cert.VerifyHostname(host); err != nil {
					t.Errorf("VerifyHostname(%s): %v", host, err)
				}
			}
			if len(cert.URIs) != 1 || cert.URIs[0].String() != tt.wantID {
				t.Errorf("URIs = %v, want [%s]", cert.URIs, tt.wantID)
			}
			if _, err := tt.cfg.ServerTLS(); err != nil {
				t.Errorf("ServerTLS: %v", err)
			}
			if _, err := tt.cfg.ClientTLS(); err != nil {
				t.Errorf("ClientTLS: %v", err)
			}
		})
	}
}

func TestGenerateDevPKIErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(dir string)
		names   []string
		wantErr string
	}{
		{name: "empty name", names: []string{""}, wantErr: "empty certificate name"},
		{name: "reserved name", names: []string{"ca"}, wantErr: "reserved"},
		{name: "dot dot", names: []string{"../escape"}, wantErr: "path segment"},
		{name: "bad character", names: []string{"a b"}, wantErr: "not allowed"},
		{
			name:    "CA key without certificate",
			setup:   func(dir string) { os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("x"), 0o600) },
			names:   []string{"bbs"},
			wantErr: "only one of",
		},
		{
			name: "corrupt CA",
			setup: func(dir string) {
				os.WriteFile(filepath.Join(dir, CACertFile), []byte("x"), 0o600)
				os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("x"), 0o600)
			},
			names:   []string{"bbs"},
			wantErr: "no PEM CERTIFICATE block",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.setup != nil {
				tt.setup(dir)
			}
			_, err := GenerateDevPKI(dir, tt.names...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("GenerateDevPKI() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

// identityServer is a health server that also records the caller's identity.
type identityServer struct {
	*health.Server
	ids chan string
}

func (s *identityServer) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	id, _ := PeerIdentity(ctx)
	s.ids <- id
	return s.Server.Check(ctx, req)
}

// startServer serves grpc health with cfg's server credentials on 127.0.0.1.
func startServer(t *testing.T, cfg Config) (string, chan string) {
	t.Helper()
	creds, err := cfg.ServerCredentials()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	ids := make(chan string, 10)
	healthpb.RegisterHealthServer(srv, &identityServer{Server: health.NewServer(), ids: ids})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), ids
}

// check makes one health call to addr with creds.
func check(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	cfgs, err := GenerateDevPKI(dir, "server", "client")
	if err != nil {
		t.Fatal(err)
	}
	other, err := GenerateDevPKI(t.TempDir(), "client")
	if err != nil {
		t.Fatal(err)
	}
	addr, ids := startServer(t, cfgs["server"])

	serverOnlyTLS, err := cfgs["client"].ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	serverOnlyTLS.Certificates = nil

	tests := []struct {
		name    string
		creds   func() (credentials.TransportCredentials, error)
		wantErr bool
		wantID  string
	}{
		{name: "dev client cert", creds: cfgs["client"].ClientCredentials, wantID: "spiffe://gavel/client"},
		{name: "server cert used as client", creds: cfgs["server"].ClientCredentials, wantID: "spiffe://gavel/server"},
		{
			name:    "no client cert",
			creds:   func() (credentials.TransportCredentials, error) { return credentials.NewTLS(serverOnlyTLS), nil },
			wantErr: true,
		},
		{
			name: "client cert from another CA",
			creds: Config{
				CertFile: other["client"].CertFile,
				KeyFile:  other["client"].KeyFile,
				CAFile:   cfgs["client"].CAFile,
			}.ClientCredentials,
			wantErr: true,
		},
		{name: "client trusting another CA", creds: other["client"].ClientCredentials, wantErr: true},
		{name: "plaintext client", creds: Config{Insecure: true}.ClientCredentials, wantErr: true},
		{
			name: "wrong server name",
			creds: Config{
				CertFile:   cfgs["client"].CertFile,
				KeyFile:    cfgs["client"].KeyFile,
				CAFile:     cfgs["client"].CAFile,
				ServerName: "bbs.example.com",
			}.ClientCredentials,
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			creds, err := tt.creds()
			if err != nil {
				t.Fatal(err)
			}
			err = check(t, addr, creds)
			if tt.wantErr {
				if err == nil {
					t.Fatal("health check succeeded, want failure")
				}
				return
			}
			if err != nil {
				t.Fatalf("health check: %v", err)
			}
			if id := <-ids; id != tt.wantID {
				t.Errorf("PeerIdentity = %q, want %q", id, tt.wantID)
			}
		})
	}
}

func TestPeerIdentityWithoutTLS(t *testing.T) {
	if id, ok := PeerIdentity(context.Background()); ok || id != "" {
		t.Errorf("PeerIdentity(no peer) = %q, %v", id, ok)
	}
	addr, ids := startServer(t, Config{Insecure: true})
	creds, _ := Config{Insecure: true}.ClientCredentials()
	if err := check(t, addr, creds); err != nil {
		t.Fatal(err)
	}
	if id := <-ids; id != "" {
		t.Errorf("PeerIdentity over plaintext = %q, want empty", id)
	}
}

func TestGenerateDevPKIHosts(t *testing.T) {
	cfgs, err := GenerateDevPKIHosts(t.TempDir(), []string{"10.1.2.3", "bbs-0"}, "bbs")
	if err != nil {
		t.Fatal(err)
	}
	pemBytes, err := os.ReadFile(cfgs["bbs"].CertFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemBytes)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"10.1.2.3", "bbs-0", "localhost", "127.0.0.1"} {
		if err := cert.VerifyHostname(host); err != nil {
			t.Errorf("certificate not valid for %s: %v", host, err)
		}
	}
}
