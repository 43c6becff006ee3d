// Package tlsx builds the mutual TLS configuration used on every Gavel gRPC
// hop, makes a development PKI, and reads the caller's identity (a
// spiffe://gavel/... URI SAN) from a verified peer certificate.
package tlsx

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
)

// SPIFFEScheme is the URI scheme of the identities carried in certificates.
const SPIFFEScheme = "spiffe"

// Config names the files that make up one side of a mutual TLS connection.
type Config struct {
	// CertFile is the PEM certificate (chain) this side presents.
	CertFile string `json:"cert_file"`
	// KeyFile is the PEM private key of CertFile.
	KeyFile string `json:"key_file"`
	// CAFile is the PEM bundle of CAs that the peer's certificate must chain to.
	CAFile string `json:"ca_file"`
	// ServerName, on clients, overrides the name checked against the server's
	// certificate; empty means the host of the dialled address.
	ServerName string `json:"server_name"`
	// Insecure disables TLS entirely (plaintext). For development and tests only.
	Insecure bool `json:"insecure"`
}

// Validate reports whether the configuration is usable: either Insecure, or
// all of CertFile, KeyFile and CAFile set.
func (c Config) Validate() error {
	if c.Insecure {
		return nil
	}
	switch {
	case c.CertFile == "":
		return errors.New("tls config: CertFile is required unless Insecure is set")
	case c.KeyFile == "":
		return errors.New("tls config: KeyFile is required unless Insecure is set")
	case c.CAFile == "":
		return errors.New("tls config: CAFile is required unless Insecure is set")
	}
	return nil
}

// ServerTLS returns a server configuration that presents CertFile and requires
// a client certificate verified against CAFile, with TLS 1.2 or later. It
// returns nil, nil when Insecure is set.
func (c Config) ServerTLS() (*tls.Config, error) {
	if c.Insecure {
		return nil, nil
	}
	cert, pool, err := c.load()
	if err != nil {
		return nil, fmt.Errorf("server tls: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}, nil
}

// ClientTLS returns a client configuration that presents CertFile and
// verifies the server against CAFile (and ServerName, if set), with TLS 1.2
// or later. It returns nil, nil when Insecure is set.
func (c Config) ClientTLS() (*tls.Config, error) {
	if c.Insecure {
		return nil, nil
	}
	cert, pool, err := c.load()
	if err != nil {
		return nil, fmt.Errorf("client tls: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   c.ServerName,
	}, nil
}

// ServerCredentials returns gRPC server transport credentials: mutual TLS
// from ServerTLS, or plaintext when Insecure is set.
func (c Config) ServerCredentials() (credentials.TransportCredentials, error) {
	if c.Insecure {
		return insecure.NewCredentials(), nil
	}
	cfg, err := c.ServerTLS()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// ClientCredentials returns gRPC client transport credentials: mutual TLS
// from ClientTLS, or plaintext when Insecure is set.
func (c Config) ClientCredentials() (credentials.TransportCredentials, error) {
	if c.Insecure {
		return insecure.NewCredentials(), nil
	}
	cfg, err := c.ClientTLS()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// load validates c and reads the key pair and the CA pool.
func (c Config) load() (tls.Certificate, *x509.CertPool, error) {
	if err := c.Validate(); err != nil {
		return tls.Certificate{}, nil, err
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load key pair %s, %s: %w", c.CertFile, c.KeyFile, err)
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return tls.Certificate{}, nil, fmt.Errorf("CA file %s: no PEM certificates found", c.CAFile)
	}
	return cert, pool, nil
}

// PeerIdentity returns the first spiffe:// URI SAN of the gRPC peer's
// verified leaf certificate. It reports false when the call did not arrive
// over verified TLS or the certificate carries no such SAN.
func PeerIdentity(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return "", false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", false
	}
	for _, u := range info.State.VerifiedChains[0][0].URIs {
		if u.Scheme == SPIFFEScheme {
			return u.String(), true
		}
	}
	return "", false
}
