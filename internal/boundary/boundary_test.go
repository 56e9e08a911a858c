package boundary

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// request returns a request as the debug listener sees it: accepted on
// local, from remote.
func request(local, remote, auth string) *http.Request {
	r := httptest.NewRequest("GET", "/debug/pprof/cmdline", nil)
	la, _ := net.ResolveTCPAddr("tcp", local)
	r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, la))
	r.RemoteAddr = remote
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	return r
}

// TestDebugGuard: the debug listener serves connections loopback at both
// ends; others need the bearer token of --debug-token-file (re-read on
// every request, so rotation takes effect at once), and without one get
// 403. A sidecar's loopback source (127.0.0.6) on the pod IP is not local.
func TestDebugGuard(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "profile") })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	code := func(h http.Handler, r *http.Request) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	open := DebugGuard(ok, "", log)
	for _, c := range []struct {
		local, remote string
		want          int
	}{
		{"127.0.0.1:6070", "127.0.0.1:50000", 200},
		{"[::1]:6070", "[::1]:50000", 200},
		{"10.1.2.3:6070", "10.9.9.9:50000", 403},
		{"10.1.2.3:6070", "127.0.0.6:50000", 403}, // Istio inbound passthrough
		{"127.0.0.1:6070", "10.9.9.9:50000", 403},
	} {
		if got := code(open, request(c.local, c.remote, "")); got != c.want {
			t.Errorf("no token file, %s from %s: %d, want %d", c.local, c.remote, got, c.want)
		}
	}

	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("tok-one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	guarded := DebugGuard(ok, file, log)
	remote := func(auth string) int { return code(guarded, request("10.1.2.3:6070", "10.9.9.9:1", auth)) }
	if got := remote(""); got != 401 {
		t.Errorf("no Authorization: %d, want 401", got)
	}
	if got := remote("Bearer tok-two"); got != 401 {
		t.Errorf("wrong token: %d, want 401", got)
	}
	if got := remote("Basic dG9rLW9uZQ=="); got != 401 {
		t.Errorf("basic auth: %d, want 401", got)
	}
	if got := remote("Bearer tok-one"); got != 200 {
		t.Errorf("right token: %d, want 200", got)
	}
	if err := os.WriteFile(file, []byte("tok-two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := remote("Bearer tok-one"); got != 401 {
		t.Errorf("old token after rotation: %d, want 401", got)
	}
	if got := remote("Bearer tok-two"); got != 200 {
		t.Errorf("new token after rotation: %d, want 200", got)
	}
	if got := code(guarded, request("127.0.0.1:6070", "127.0.0.1:2", "")); got != 200 {
		t.Errorf("loopback without token, token file set: %d, want 200", got)
	}
}

// TestJSONBoundaryGuard: /json under gRPC TLS needs --http-tls, and under
// gRPC mTLS a verified client certificate with the required SAN.
func TestJSONBoundaryGuard(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "{}") })
	code := func(b JSON, st *tls.ConnectionState) (int, string) {
		r := httptest.NewRequest("POST", "/json", strings.NewReader("{}"))
		r.TLS = st
		rec := httptest.NewRecorder()
		b.Guard(ok).ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}
	if b := JSONOf(TLS{}); b.off || b.clientCert {
		t.Errorf("plaintext gRPC: boundary %+v, want /json as is", b)
	}
	off := JSONOf(TLS{Cert: "c", Key: "k"})
	if c, body := code(off, nil); c != 403 || !strings.Contains(body, "--http-tls") {
		t.Errorf("gRPC TLS, HTTP plaintext: %d %q, want 403 naming --http-tls", c, body)
	}
	if b := JSONOf(TLS{Cert: "c", Key: "k", HTTP: true}); b.off || b.clientCert {
		t.Errorf("gRPC TLS without client CA, --http-tls: boundary %+v, want open", b)
	}
	const san = "spiffe://cluster.local/ns/gw/sa/envoy"
	mtls := JSONOf(TLS{Cert: "c", Key: "k", ClientCA: "ca", ClientSAN: san, HTTP: true})
	cert := func(uri string) *x509.Certificate {
		c := &x509.Certificate{}
		if uri != "" {
			c.URIs = append(c.URIs, mustURL(t, uri))
		}
		return c
	}
	if c, _ := code(mtls, &tls.ConnectionState{}); c != 403 {
		t.Errorf("mTLS, no client certificate: %d, want 403", c)
	}
	wrong := cert("spiffe://cluster.local/ns/default/sa/other")
	if c, _ := code(mtls, &tls.ConnectionState{PeerCertificates: []*x509.Certificate{wrong}, VerifiedChains: [][]*x509.Certificate{{wrong}}}); c != 403 {
		t.Errorf("mTLS, wrong SAN: %d, want 403", c)
	}
	good := cert(san)
	if c, _ := code(mtls, &tls.ConnectionState{PeerCertificates: []*x509.Certificate{good}}); c != 403 {
		t.Errorf("mTLS, right SAN but unverified chain: %d, want 403", c)
	}
	if c, _ := code(mtls, &tls.ConnectionState{PeerCertificates: []*x509.Certificate{good}, VerifiedChains: [][]*x509.Certificate{{good}}}); c != 200 {
		t.Errorf("mTLS, verified certificate with the SAN: %d, want 200", c)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
