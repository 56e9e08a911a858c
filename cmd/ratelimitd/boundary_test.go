package main

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

// TestRedactArgs: every form the flag package accepts for a secret flag is
// redacted; other flags and positional words stay.
func TestRedactArgs(t *testing.T) {
	const pw = "S3cret-pw"
	in := []string{"ratelimitd", "serve",
		"--redis-url=redis://user:" + pw + "@h:6379/0",
		"-redis-url", "rediss://:" + pw + "@h:6380/1",
		"--redis-sentinel-auth", "admin:" + pw,
		"-redis-sentinel-auth=" + pw,
		"--redis-url=redis://u:" + pw + "@h:bad/0", // does not parse
		"--config", "/etc/rl", "--key-prefix=" + "k",
	}
	got := redactArgs(in)
	joined := strings.Join(got, " ")
	if strings.Contains(joined, pw) {
		t.Fatalf("a secret survived: %q", got)
	}
	for _, want := range []string{"--redis-url=redis://user:xxxxx@h:6379/0", "rediss://:xxxxx@h:6380/1", "-redis-sentinel-auth=xxxxx", "--config", "/etc/rl", "--key-prefix=k"} {
		if !strings.Contains(joined, want) {
			t.Errorf("redacted command line %q lacks %q", joined, want)
		}
	}
	if in[2] != "--redis-url=redis://user:"+pw+"@h:6379/0" {
		t.Error("redactArgs changed its input")
	}
	rec := httptest.NewRecorder()
	cmdlineHandler(in).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/cmdline", nil))
	if body := rec.Body.String(); strings.Contains(body, pw) || !strings.Contains(body, "serve\x00") {
		t.Errorf("cmdline body %q: want NUL-separated arguments without the secret", body)
	}
}

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
	open := debugGuard(ok, "", log)
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
	guarded := debugGuard(ok, file, log)
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
	code := func(b jsonBoundary, st *tls.ConnectionState) (int, string) {
		r := httptest.NewRequest("POST", "/json", strings.NewReader("{}"))
		r.TLS = st
		rec := httptest.NewRecorder()
		b.guard(ok).ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}
	if b := jsonBoundaryOf(Options{}); b.off || b.clientCert {
		t.Errorf("plaintext gRPC: boundary %+v, want /json as is", b)
	}
	off := jsonBoundaryOf(Options{GRPCTLSCert: "c", GRPCTLSKey: "k"})
	if c, body := code(off, nil); c != 403 || !strings.Contains(body, "--http-tls") {
		t.Errorf("gRPC TLS, HTTP plaintext: %d %q, want 403 naming --http-tls", c, body)
	}
	if b := jsonBoundaryOf(Options{GRPCTLSCert: "c", GRPCTLSKey: "k", HTTPTLS: true}); b.off || b.clientCert {
		t.Errorf("gRPC TLS without client CA, --http-tls: boundary %+v, want open", b)
	}
	const san = "spiffe://cluster.local/ns/gw/sa/envoy"
	mtls := jsonBoundaryOf(Options{GRPCTLSCert: "c", GRPCTLSKey: "k", GRPCTLSClientCA: "ca", GRPCTLSClientSAN: san, HTTPTLS: true})
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

// TestRedisFlagsNeedRedisBackend: a Redis flag or twin without --backend
// is refused (each replica would count alone on the memory store);
// --backend=memory given explicitly, or the reference's REDIS_URL (which
// selects Redis), is accepted.
func TestRedisFlagsNeedRedisBackend(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	for _, c := range []struct {
		args    []string
		env     func(string) (string, bool)
		wantErr bool
	}{
		{[]string{"--redis-url=redis://127.0.0.1:1/0"}, env(), true},
		{nil, env("RATELIMITD_REDIS_URL", "redis://127.0.0.1:1/0"), true},
		{[]string{"--redis-mode=cluster", "--redis-addrs=a:1"}, env(), true},
		{[]string{"--backend=memory", "--redis-url=redis://127.0.0.1:1/0"}, env(), false},
		{[]string{"--backend=redis", "--redis-url=redis://127.0.0.1:1/0"}, env(), false},
		{[]string{"--config=x"}, env("REDIS_URL", "127.0.0.1:6379", "REDIS_SOCKET_TYPE", "tcp"), false},
	} {
		o, _, err := parseServe(c.args, c.env, io.Discard)
		if (err != nil) != c.wantErr {
			t.Errorf("%v: err %v (backend %s), want error %v", c.args, err, o.Backend, c.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "--backend=redis") {
			t.Errorf("%v: %v, want a hint naming --backend=redis", c.args, err)
		}
	}
}
