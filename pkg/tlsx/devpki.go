package tlsx

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gavel-sched/gavel/pkg/atomicfile"
)

// Validity periods of development certificates.
const (
	devCAValidity   = 10 * 365 * 24 * time.Hour
	devLeafValidity = 2 * 365 * 24 * time.Hour
)

// File names of the development CA inside the PKI directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// GenerateDevPKI makes a development PKI in dir: a CA (ca.crt, ca.key),
// reused if both files already exist, and for each name a leaf key pair
// <name>.crt and <name>.key (ECDSA P-256) signed by it. Each leaf is valid
// for both server and client authentication and carries the SANs DNS
// localhost, IP 127.0.0.1 and ::1, and URI spiffe://gavel/<name>. A name may
// contain slashes ("rep/cell-1"); its files then go in subdirectories. Leaves
// are rewritten on every call. It returns a Config per name that points at
// the files.
func GenerateDevPKI(dir string, names ...string) (map[string]Config, error) {
	return GenerateDevPKIHosts(dir, nil, names...)
}

// GenerateDevPKIHosts is GenerateDevPKI with extra SANs on every leaf: each host is an IP
// address or a DNS name (e.g. the container addresses of a deployment, so peers that dial
// each other by address can verify the server's certificate).
func GenerateDevPKIHosts(dir string, hosts []string, names ...string) (map[string]Config, error) {
	for _, name := range names {
		if err := validateDevName(name); err != nil {
			return nil, fmt.Errorf("dev pki: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("dev pki: create %s: %w", dir, err)
	}
	caCertPath := filepath.Join(dir, CACertFile)
	caKeyPath := filepath.Join(dir, CAKeyFile)
	var (
		caCert *x509.Certificate
		caKey  crypto.Signer
		err    error
	)
	switch certExists, keyExists := exists(caCertPath), exists(caKeyPath); {
	case certExists && keyExists:
		caCert, caKey, err = loadCA(caCertPath, caKeyPath)
	case !certExists && !keyExists:
		caCert, caKey, err = createCA(caCertPath, caKeyPath)
	default:
		err = fmt.Errorf("only one of %s and %s exists; remove it or restore the other", caCertPath, caKeyPath)
	}
	if err != nil {
		return nil, fmt.Errorf("dev pki: %w", err)
	}
	configs := make(map[string]Config, len(names))
	for _, name := range names {
		base := filepath.Join(dir, filepath.FromSlash(name))
		cfg := Config{CertFile: base + ".crt", KeyFile: base + ".key", CAFile: caCertPath}
		if err := createLeaf(name, hosts, cfg, caCert, caKey); err != nil {
			return nil, fmt.Errorf("dev pki: certificate %q: %w", name, err)
		}
		configs[name] = cfg
	}
	return configs, nil
}

// validateDevName accepts slash-separated segments of [A-Za-z0-9._-], none
// of them "." or "..", and rejects the CA's own name.
func validateDevName(name string) error {
	if name == "" {
		return errors.New("empty certificate name")
	}
	if name == "ca" {
		return errors.New(`certificate name "ca" is reserved for the CA`)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("certificate name %q: empty, \".\" or \"..\" path segment", name)
		}
		for _, r := range seg {
			ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
			if !ok {
				return fmt.Errorf("certificate name %q: character %q not allowed", name, r)
			}
		}
	}
	return nil
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// loadCA reads an existing CA certificate and its PKCS#8 key.
func loadCA(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, fmt.Errorf("read CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("read CA key: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("CA certificate %s: no PEM CERTIFICATE block", certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA certificate %s: %w", certPath, err)
	}
	if !cert.IsCA {
		return nil, nil, fmt.Errorf("CA certificate %s is not a CA", certPath)
	}
	block, _ = pem.Decode(keyPEM)
	if block == nil {
		return nil, nil, fmt.Errorf("CA key %s: no PEM block", keyPath)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA key %s: %w", keyPath, err)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("CA key %s: %T cannot sign", keyPath, parsed)
	}
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, nil, fmt.Errorf("CA key %s does not match certificate %s", keyPath, certPath)
	}
	return cert, key, nil
}

// createCA makes a self-signed CA and writes it to certPath and keyPath.
func createCA(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Gavel development CA", Organization: []string{"Gavel"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(devCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	if err := writeKeyPair(certPath, keyPath, der, key); err != nil {
		return nil, nil, fmt.Errorf("write CA: %w", err)
	}
	return cert, key, nil
}

// createLeaf makes the leaf certificate for name and writes it where cfg says.
func createLeaf(name string, hosts []string, cfg Config, caCert *x509.Certificate, caKey crypto.Signer) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return err
	}
	id := &url.URL{Scheme: SPIFFEScheme, Host: "gavel", Path: "/" + name}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"Gavel"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(devLeafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		URIs:         []*url.URL{id},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("sign certificate: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.CertFile), 0o755); err != nil {
		return fmt.Errorf("create directory: %w", err)
	}
	return writeKeyPair(cfg.CertFile, cfg.KeyFile, der, key)
}

// writeKeyPair writes the certificate (0644) and the PKCS#8 key (0600) as PEM.
func writeKeyPair(certPath, keyPath string, certDER []byte, key crypto.Signer) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal key: %w", err)
	}
	if err := writePEM(keyPath, "PRIVATE KEY", keyDER, 0o600); err != nil {
		return err
	}
	return writePEM(certPath, "CERTIFICATE", certDER, 0o644)
}

// writePEM replaces path with one PEM block, via a temporary file and rename.
func writePEM(path, blockType string, der []byte, perm os.FileMode) error {
	return atomicfile.Write(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), perm)
}

// randomSerial returns a random positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return serial.Add(serial, big.NewInt(1)), nil
}
