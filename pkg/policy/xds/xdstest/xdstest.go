// Package xdstest runs a real xDS management server for tests: the
// aggregated discovery service of go-control-plane (pkg/server/v3) over
// its snapshot cache (pkg/cache/v3), as Envoy Gateway runs it for its
// rate-limit service, on a loopback port with mutual TLS, and records the
// DiscoveryRequests it receives (ACKs and NACKs) through the server's
// callbacks. Certificates are generated per server.
package xdstest

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
	"strconv"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// NodeID is the node Envoy Gateway serves its rate-limit configs to.
const NodeID = "envoy-ratelimit"

// ServerName is the DNS name in the server certificate (besides 127.0.0.1).
const ServerName = "envoy-gateway"

// Certs are PEM files in a test's temporary directory.
type Certs struct {
	CA string // CA of the server and of the good client
	// ServerCert is the server's certificate, signed by CA, for
	// ServerName and 127.0.0.1.
	ServerCert string
	// ServerKey is ServerCert's private key (EC, PEM "EC PRIVATE KEY").
	ServerKey  string
	ClientCert string // signed by CA
	// ClientKey is ClientCert's private key (EC, PEM).
	ClientKey string
	// RogueCert and RogueKey are a client certificate signed by another
	// CA, which the server refuses.
	RogueCert string
	// RogueKey is RogueCert's private key (EC, PEM).
	RogueKey string
}

// NewCerts generates a CA, a server certificate for ServerName and
// 127.0.0.1, a client certificate, and a rogue client certificate.
func NewCerts(t testing.TB) Certs {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert := newCA(t, "xdstest CA")
	rogueKey, rogueCA := newCA(t, "rogue CA")
	c := Certs{CA: filepath.Join(dir, "ca.crt")}
	writePEM(t, c.CA, "CERTIFICATE", caCert.Raw)
	c.ServerCert, c.ServerKey = leaf(t, dir, "server", caCert, caKey, true)
	c.ClientCert, c.ClientKey = leaf(t, dir, "client", caCert, caKey, false)
	c.RogueCert, c.RogueKey = leaf(t, dir, "rogue", rogueCA, rogueKey, false)
	return c
}

var serial struct {
	sync.Mutex
	n int64
}

func nextSerial() *big.Int {
	serial.Lock()
	defer serial.Unlock()
	serial.n++
	return big.NewInt(serial.n)
}

// newCA generates a self-signed CA called name.
func newCA(t testing.TB, name string) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	key, der := issue(t, tmpl, nil, nil)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

// leaf generates a certificate called name signed by ca, for a server
// (ServerName and 127.0.0.1) or a client, and writes it and its key to
// dir/name.crt and dir/name.key.
func leaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, server bool) (string, string) {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{ServerName}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	key, der := issue(t, tmpl, ca, caKey)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

// issue generates an ECDSA P-256 key and the DER certificate of tmpl for
// it, with the next serial number, valid from an hour ago for a day,
// signed by parent with parentKey, or self-signed when parent is nil.
func issue(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = nextSerial()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Server is a go-control-plane ADS server with a snapshot cache.
type Server struct {
	t testing.TB
	// Certs are the files the server was started with (its own
	// certificate and the CA it checks clients against).
	Certs Certs
	// Cache holds the snapshot served per node id (ADS, state of the
	// world); tests may set snapshots on it directly.
	Cache cachev3.SnapshotCache
	// Addr is host:port, kept across Restart.
	Addr string

	mu       sync.Mutex
	gs       *grpc.Server
	done     chan struct{}
	requests []*discovery.DiscoveryRequest
	headers  []metadata.MD // incoming metadata of each stream opened
	changed  chan struct{} // closed and replaced on every request
	version  int
}

// Start runs a server on a free loopback port with mutual TLS (client
// certificates signed by certs.CA required). It is stopped at cleanup.
func Start(t testing.TB, certs Certs) *Server {
	t.Helper()
	s := &Server{t: t, Certs: certs, Cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), changed: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) serve(ln net.Listener) {
	cert, err := tls.LoadX509KeyPair(s.Certs.ServerCert, s.Certs.ServerKey)
	if err != nil {
		s.t.Fatal(err)
	}
	caPEM, err := os.ReadFile(s.Certs.CA)
	if err != nil {
		s.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			s.mu.Lock()
			s.headers = append(s.headers, md)
			s.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			s.mu.Lock()
			s.requests = append(s.requests, req)
			close(s.changed)
			s.changed = make(chan struct{})
			s.mu.Unlock()
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	xs := serverv3.NewServer(ctx, s.Cache, cb)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)))
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		_ = gs.Serve(ln)
	}()
	s.mu.Lock()
	s.gs, s.done = gs, done
	s.mu.Unlock()
}

// Stop stops the server (streams end with an error on the client side).
func (s *Server) Stop() {
	s.mu.Lock()
	gs, done := s.gs, s.done
	s.gs = nil
	s.mu.Unlock()
	if gs == nil {
		return
	}
	gs.Stop()
	<-done
}

// Restart starts the server again on the same address with the same
// cache (a management server restarting: the snapshots it serves stay).
func (s *Server) Restart() {
	s.t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 100; i++ {
		if ln, err = net.Listen("tcp", s.Addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("xdstest: listen again on %s: %v", s.Addr, err)
	}
	s.serve(ln)
}

// Set publishes a snapshot of configs for node under a fresh version
// ("1", "2", …), which it returns.
func (s *Server) Set(node string, configs ...*rlsconf.RateLimitConfig) string {
	s.t.Helper()
	s.mu.Lock()
	s.version++
	v := strconv.Itoa(s.version)
	s.mu.Unlock()
	res := make([]types.Resource, 0, len(configs))
	for _, c := range configs {
		res = append(res, c)
	}
	snap, err := cachev3.NewSnapshot(v, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.Cache.SetSnapshot(context.Background(), node, snap); err != nil {
		s.t.Fatal(err)
	}
	return v
}

// Requests returns every DiscoveryRequest received so far.
func (s *Server) Requests() []*discovery.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discovery.DiscoveryRequest(nil), s.requests...)
}

// Headers returns the gRPC metadata each stream was opened with.
func (s *Server) Headers() []metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]metadata.MD(nil), s.headers...)
}

// WaitRequest waits (at most within) for a request, received before or
// after the call, that ok accepts, and returns it.
func (s *Server) WaitRequest(within time.Duration, ok func(*discovery.DiscoveryRequest) bool) (*discovery.DiscoveryRequest, error) {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		for _, r := range s.requests {
			if ok(r) {
				s.mu.Unlock()
				return r, nil
			}
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return nil, fmt.Errorf("xdstest: no matching DiscoveryRequest within %v (%d received)", within, len(s.Requests()))
		}
	}
}

// IsACK accepts an ACK of version: the request names it, with no error.
func IsACK(version string) func(*discovery.DiscoveryRequest) bool {
	return func(r *discovery.DiscoveryRequest) bool {
		return r.GetVersionInfo() == version && r.GetResponseNonce() != "" && r.GetErrorDetail() == nil
	}
}

// IsNACK accepts a NACK (a request with error_detail) that keeps version.
func IsNACK(kept string) func(*discovery.DiscoveryRequest) bool {
	return func(r *discovery.DiscoveryRequest) bool {
		return r.GetErrorDetail() != nil && r.GetVersionInfo() == kept
	}
}

// ClientEnv is the environment envoyproxy/ratelimit reads, as Envoy
// Gateway sets it, for a client of s with the good client certificate.
func (s *Server) ClientEnv() []string {
	return []string{
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + s.Addr,
		"CONFIG_GRPC_XDS_NODE_ID=" + NodeID,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + s.Certs.ClientCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + s.Certs.ClientKey,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + s.Certs.CA,
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN=" + ServerName,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
	}
}

// Names in Envoy Gateway's generated configs (its xDS translator,
// BuildRateLimitServiceConfig): one RateLimitConfig per listener, whose
// domain is "<namespace>/<gateway>/<listener>", with one top-level
// descriptor per route; a shared limit (BackendTrafficPolicy shared: true)
// has its own config and domain "<policy name>-<policy namespace>".
// EGConfigs shows the descriptor chains under them.
const (
	EGDomain     = "default/eg/http"
	EGRoute      = "httproute/default/backend/rule/0/match/0/www_example_com"
	EGSharedName = "shared-limit"
	EGSharedNS   = "default"
	EGShared     = EGSharedName + "-" + EGSharedNS // the shared config's domain
)

// EGConfigs returns Envoy Gateway's configs for one route with four rules
// and one shared limit, each limit scaled by n:
//
//	rule 0: header x-user-id distinct      [route][rule-0-match-0=<id>]           n per hour
//	rule 1: header x-plan exact "free"     [route][rule-1-match-0=rule-1-match-0] 2n per hour
//	rule 2: source CIDR 10.0.0.0/8 distinct [route][masked_remote_address=10.0.0.0/8][remote_address=<ip>] 3n per minute
//	rule 3: no match                        [route][rule-3-match--1=rule-3-match--1] 100n per second
//	shared: header x-user-id distinct      [shared-limit=default][rule-0-match-0=<id>] 4n per day
func EGConfigs(n uint32) []*rlsconf.RateLimitConfig {
	lim := func(rpu uint32, u rlsconf.RateLimitUnit) *rlsconf.RateLimitPolicy {
		return &rlsconf.RateLimitPolicy{RequestsPerUnit: rpu, Unit: u}
	}
	kv := func(k string) *rlsconf.RateLimitDescriptor { return &rlsconf.RateLimitDescriptor{Key: k, Value: k} }
	rule1 := kv("rule-1-match-0")
	rule1.RateLimit = lim(2*n, rlsconf.RateLimitUnit_HOUR)
	rule3 := kv("rule-3-match--1")
	rule3.RateLimit = lim(100*n, rlsconf.RateLimitUnit_SECOND)
	route := &rlsconf.RateLimitConfig{
		Name:   EGDomain,
		Domain: EGDomain,
		Descriptors: []*rlsconf.RateLimitDescriptor{{
			Key: EGRoute, Value: EGRoute,
			Descriptors: []*rlsconf.RateLimitDescriptor{
				{Key: "rule-0-match-0", RateLimit: lim(n, rlsconf.RateLimitUnit_HOUR)},
				rule1,
				{Key: "masked_remote_address", Value: "10.0.0.0/8", Descriptors: []*rlsconf.RateLimitDescriptor{
					{Key: "remote_address", RateLimit: lim(3*n, rlsconf.RateLimitUnit_MINUTE)},
				}},
				rule3,
			},
		}},
	}
	shared := &rlsconf.RateLimitConfig{
		Name:   EGShared,
		Domain: EGShared,
		Descriptors: []*rlsconf.RateLimitDescriptor{{
			Key: EGSharedName, Value: EGSharedNS,
			Descriptors: []*rlsconf.RateLimitDescriptor{
				{Key: "rule-0-match-0", RateLimit: lim(4*n, rlsconf.RateLimitUnit_DAY)},
			},
		}},
	}
	return []*rlsconf.RateLimitConfig{route, shared}
}
