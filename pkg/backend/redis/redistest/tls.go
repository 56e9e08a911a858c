package redistest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// TLSFiles are PEM files generated for a test: a self-signed CA, a server
// certificate for 127.0.0.1 / ::1 / localhost and a client certificate, both
// signed by the CA (ECDSA P-256, valid from one hour ago for one day).
type TLSFiles struct {
	// CAFile is the self-signed CA's certificate (PEM), which signs the
	// other two.
	CAFile   string
	CertFile string // server certificate
	KeyFile  string // server key
	// ClientCertFile is the client certificate (PEM) for mutual TLS.
	ClientCertFile string
	// ClientKeyFile is ClientCertFile's private key (PEM).
	ClientKeyFile string

	caPool     *x509.CertPool
	clientCert tls.Certificate
	serverName string // the name ClientConfig verifies; "" for the dialed host
}

// ClientConfig is a client tls.Config trusting the generated CA and
// presenting the generated client certificate (TLS 1.2 minimum); it
// verifies the server certificate's first name (WithTLSServerNames).
func (f *TLSFiles) ClientConfig() *tls.Config {
	return &tls.Config{
		ServerName:   f.serverName,
		RootCAs:      f.caPool,
		Certificates: []tls.Certificate{f.clientCert},
		MinVersion:   tls.VersionTLS12,
	}
}

// WithTLSProtocols is WithTLS with the server limited to the given
// protocol versions (redis-server's tls-protocols: "TLSv1.2", "TLSv1.3").
// Without it redis-server accepts both and negotiates TLS 1.3 with Go
// clients. It combines with WithTLSClientAuth in either order.
func WithTLSProtocols(versions ...string) Option {
	return func(c *config) {
		c.tls = true
		c.extra = append(c.extra, "--tls-protocols", strings.Join(versions, " "))
	}
}

// TLSVersion dials the server once with TLSFiles.ClientConfig (TLS 1.2 or
// later, client certificate presented) and returns the negotiated
// version (tls.VersionTLS12, tls.VersionTLS13). It errors without WithTLS
// or when the handshake fails within ctx.
func (s *Server) TLSVersion(ctx context.Context) (uint16, error) {
	if s.tls == nil {
		return 0, fmt.Errorf("redistest: %s does not use TLS", s.Addr())
	}
	d := &tls.Dialer{Config: s.tls.ClientConfig()}
	c, err := d.DialContext(ctx, "tcp", s.Addr())
	if err != nil {
		return 0, fmt.Errorf("redistest: tls dial %s: %w", s.Addr(), err)
	}
	defer func() { _ = c.Close() }()
	return c.(*tls.Conn).ConnectionState().Version, nil
}

// GenerateTLS writes ca.crt, server.crt, server.key, client.crt and
// client.key into dir.
func GenerateTLS(dir string) (*TLSFiles, error) { return generateTLS(dir, nil) }

// generateTLS is GenerateTLS with a server certificate for the DNS names
// serverNames alone (no IP address) when serverNames is not empty.
func generateTLS(dir string, serverNames []string) (*TLSFiles, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("redistest: ca key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("redistest: ca cert: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("redistest: ca cert: %w", err)
	}
	f := &TLSFiles{
		CAFile:         filepath.Join(dir, "ca.crt"),
		CertFile:       filepath.Join(dir, "server.crt"),
		KeyFile:        filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.crt"),
		ClientKeyFile:  filepath.Join(dir, "client.key"),
		caPool:         x509.NewCertPool(),
	}
	if len(serverNames) > 0 {
		f.serverName = serverNames[0]
	}
	f.caPool.AddCert(caCert)
	if err := writePEM(f.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, certFile, keyFile string, names ...string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("redistest: %s key: %w", cn, err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			DNSNames:     []string{"localhost"},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		}
		if len(names) > 0 {
			tmpl.DNSNames, tmpl.IPAddresses = names, nil
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("redistest: %s cert: %w", cn, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return fmt.Errorf("redistest: %s key: %w", cn, err)
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyFile, "PRIVATE KEY", keyDER)
	}
	if err := leaf(2, "redistest server", x509.ExtKeyUsageServerAuth, f.CertFile, f.KeyFile, serverNames...); err != nil {
		return nil, err
	}
	if err := leaf(3, "redistest client", x509.ExtKeyUsageClientAuth, f.ClientCertFile, f.ClientKeyFile); err != nil {
		return nil, err
	}
	f.clientCert, err = tls.LoadX509KeyPair(f.ClientCertFile, f.ClientKeyFile)
	if err != nil {
		return nil, fmt.Errorf("redistest: client key pair: %w", err)
	}
	return f, nil
}

func writePEM(path, typ string, der []byte) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	return nil
}
