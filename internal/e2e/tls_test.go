package e2e

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
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// testCA issues certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64 = 1

// newKeyCert generates a P-256 key and a DER certificate of tmpl for it,
// with the next serial number, valid from an hour ago to an hour from
// now, signed by ca (self-signed when ca is nil).
func newKeyCert(t *testing.T, tmpl *x509.Certificate, ca *testCA) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	der, key := newKeyCert(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "e2e CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}, nil)
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns PEM certificate and key for cn with the given SANs.
func (ca *testCA) issue(t *testing.T, cn string, server bool, uris ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, key := newKeyCert(t, tmpl, ca)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// serverFiles writes a server certificate for cn (server.pem,
// server-key.pem) and the CA (ca.pem) into a new directory and returns it.
func (ca *testCA) serverFiles(t *testing.T, cn string) string {
	t.Helper()
	dir := t.TempDir()
	srvCert, srvKey := ca.issue(t, cn, true)
	writeFile(t, dir, "server.pem", string(srvCert))
	writeFile(t, dir, "server-key.pem", string(srvKey))
	writeFile(t, dir, "ca.pem", string(ca.pem))
	return dir
}

// tlsSetup makes a CA, a server certificate for cn in dir (serverFiles)
// and a config directory holding oneFile with limit.
func tlsSetup(t *testing.T, cn string, limit int) (ca *testCA, dir, cfgDir string) {
	t.Helper()
	ca = newCA(t)
	dir = ca.serverFiles(t, cn)
	cfgDir = t.TempDir()
	writeFile(t, cfgDir, "e2e.yaml", fmt.Sprintf(oneFile, limit))
	return ca, dir, cfgDir
}

func clientTLS(t *testing.T, ca *testCA, certPEM, keyPEM []byte) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// checkHealth makes one health call over TLS with cfg.
func checkHealth(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("status %v", resp.GetStatus())
	}
	return nil
}

// TestGRPCMutualTLS: gRPC mTLS with a required SAN; a replaced server
// certificate is served without a restart.
func TestGRPCMutualTLS(t *testing.T) {
	ca, dir, cfgDir := tlsSetup(t, "server-1", 3)
	const san = "spiffe://cluster.local/ns/istio-system/sa/ingress"

	p := start(t, startOpts{args: []string{"--config", cfgDir,
		"--grpc-tls-cert", filepath.Join(dir, "server.pem"), "--grpc-tls-key", filepath.Join(dir, "server-key.pem"),
		"--grpc-tls-client-ca", filepath.Join(dir, "ca.pem"), "--grpc-tls-client-san", san}})

	goodCert, goodKey := ca.issue(t, "envoy", false, san)
	good := clientTLS(t, ca, goodCert, goodKey)
	eventually(t, settleWithin, func() string {
		if err := checkHealth(t, p.grpc, good); err != nil {
			return "client with the right certificate: " + err.Error()
		}
		return ""
	})
	if err := checkHealth(t, p.grpc, clientTLS(t, ca, nil, nil)); err == nil {
		t.Error("a client without a certificate was accepted")
	}
	wrongCert, wrongKey := ca.issue(t, "other", false, "spiffe://cluster.local/ns/default/sa/other")
	if err := checkHealth(t, p.grpc, clientTLS(t, ca, wrongCert, wrongKey)); err == nil {
		t.Error("a client certificate without the required SAN was accepted")
	}
	otherCA := newCA(t)
	foreignCert, foreignKey := otherCA.issue(t, "envoy", false, san)
	if err := checkHealth(t, p.grpc, clientTLS(t, ca, foreignCert, foreignKey)); err == nil {
		t.Error("a client certificate from another CA was accepted")
	}

	// Rotate the server certificate on disk.
	peerCN := func() string {
		conn, err := tls.Dial("tcp", p.grpc, good)
		if err != nil {
			return "dial: " + err.Error()
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := peerCN(); cn != "server-1" {
		t.Fatalf("server certificate CN %q, want server-1", cn)
	}
	srvCert2, srvKey2 := ca.issue(t, "server-2", true)
	writeFile(t, dir, "server-key.pem", string(srvKey2))
	writeFile(t, dir, "server.pem", string(srvCert2))
	eventually(t, settleWithin, func() string {
		if cn := peerCN(); cn != "server-2" {
			return "server certificate CN " + cn + ", want server-2 after rotation"
		}
		return ""
	})
	if err := checkHealth(t, p.grpc, good); err != nil {
		t.Errorf("after rotation: %v", err)
	}
}
