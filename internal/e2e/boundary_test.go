package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// The adversarial cases of the trust boundary (docs/security.md, "Trust
// boundaries" and "Secrets"), each against the real binary.

// tlsPost is POST url with body over TLS cfg (HTTP/1.1 or HTTP/2); err for
// a failed handshake or request.
func tlsPost(cfg *tls.Config, url, body string) (int, string, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2", "http/1.1"}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	defer c.CloseIdleConnections()
	var resp *http.Response
	var err error
	if body == "" {
		resp, err = c.Get(url)
	} else {
		resp, err = c.Post(url, "application/json", strings.NewReader(body))
	}
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestJSONBehindGRPCBoundary: with gRPC under mTLS, POST /json decides
// only for a client that gRPC would accept. Without --http-tls it is off
// (403 naming the flag) although the HTTP port answers; with --http-tls
// the HTTP listener serves TLS, /healthcheck and /metrics answer clients
// without a certificate, and /json needs a certificate from the gRPC
// client CA with the required SAN. A refused /json consumes nothing.
func TestJSONBehindGRPCBoundary(t *testing.T) {
	ca, dir, cfgDir := tlsSetup(t, "server", 2)
	const san = "spiffe://cluster.local/ns/gw/sa/envoy"
	tlsArgs := []string{"--config", cfgDir,
		"--grpc-tls-cert", filepath.Join(dir, "server.pem"), "--grpc-tls-key", filepath.Join(dir, "server-key.pem"),
		"--grpc-tls-client-ca", filepath.Join(dir, "ca.pem"), "--grpc-tls-client-san", san}
	goodCert, goodKey := ca.issue(t, "envoy", false, san)
	good := clientTLS(t, ca, goodCert, goodKey)
	req := `{"domain":"e2e","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`

	t.Run("plaintext HTTP", func(t *testing.T) {
		p := start(t, startOpts{args: tlsArgs})
		eventually(t, settleWithin, func() string {
			if err := checkHealth(t, p.grpc, good); err != nil {
				return err.Error()
			}
			return ""
		})
		for i := 0; i < 3; i++ {
			if code, body := httpPost(t, "http://"+p.http+"/json", req); code != 403 || !strings.Contains(body, "--http-tls") {
				t.Fatalf("POST /json on plaintext HTTP with gRPC mTLS: %d %s, want 403 naming --http-tls", code, body)
			}
		}
		if code, _ := httpGet(t, "http://"+p.http+"/healthcheck"); code != 200 {
			t.Errorf("/healthcheck: %d, want 200", code)
		}
		if !strings.Contains(p.Logs(), `"json":"off`) {
			t.Errorf("startup log does not say /json is off:\n%s", p.Logs())
		}
	})

	t.Run("--http-tls", func(t *testing.T) {
		p := start(t, startOpts{args: append(append([]string{}, tlsArgs...), "--http-tls")})
		noCert := clientTLS(t, ca, nil, nil)
		eventually(t, settleWithin, func() string {
			code, body, err := tlsPost(noCert, "https://"+p.http+"/healthcheck", "")
			if err != nil || code != 200 {
				return fmt.Sprintf("/healthcheck without a client certificate: %d %s %v", code, body, err)
			}
			return ""
		})
		if code, body, err := tlsPost(noCert, "https://"+p.http+"/metrics", ""); err != nil || code != 200 || !strings.Contains(body, "ratelimitd_") {
			t.Errorf("/metrics without a client certificate: %d %v", code, err)
		}
		wrongCert, wrongKey := ca.issue(t, "other", false, "spiffe://cluster.local/ns/default/sa/other")
		foreign := newCA(t)
		fCert, fKey := foreign.issue(t, "envoy", false, san)
		for name, cfg := range map[string]*tls.Config{
			"no certificate": noCert,
			"wrong SAN":      clientTLS(t, ca, wrongCert, wrongKey),
		} {
			if code, body, err := tlsPost(cfg, "https://"+p.http+"/json", req); err != nil || code != 403 {
				t.Errorf("/json, %s: %d %s %v, want 403", name, code, body, err)
			}
		}
		// A certificate from another CA fails the handshake.
		if code, _, err := tlsPost(clientTLS(t, ca, fCert, fKey), "https://"+p.http+"/json", req); err == nil {
			t.Errorf("/json with a certificate from another CA: %d, want a failed handshake", code)
		}
		// Plaintext to the TLS port is not served.
		c := &http.Client{Timeout: 5 * time.Second}
		if resp, err := c.Post("http://"+p.http+"/json", "application/json", strings.NewReader(req)); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 || resp.StatusCode == 429 {
				t.Errorf("plaintext POST /json to the TLS listener decided: %d", resp.StatusCode)
			}
		}
		// The refusals consumed nothing: the limit of 2 admits 2.
		for i, want := range []int{200, 200, 429} {
			code, body, err := tlsPost(good, "https://"+p.http+"/json", req)
			if err != nil || code != want {
				t.Fatalf("/json with the right certificate, call %d: %d %s %v, want %d", i, code, body, err, want)
			}
		}
		// gRPC sees the same counter.
		cc := dialTLS(t, p.grpc, good)
		if resp := call(t, cc, "e2e", desc("k", "v")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("gRPC after /json used the limit: %v, want OVER_LIMIT", resp.GetOverallCode())
		}
	})

	t.Run("--http-tls needs a certificate", func(t *testing.T) {
		code, _, stderr := runCmd(t, "serve", "--config", cfgDir, "--http-tls", "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=")
		if code != 2 || !strings.Contains(stderr, "--http-tls") {
			t.Errorf("--http-tls without --grpc-tls-cert: exit %d, stderr %q; want 2 naming --http-tls", code, stderr)
		}
	})
}

// TestSecretsNotExposed: a Redis password given in --redis-url, in
// --redis-sentinel-auth or through the reference's REDIS_AUTH never shows
// in /debug/pprof/cmdline, in the logs (debug level) or in startup errors;
// with --redis-password-file the URL carries none and decisions count.
func TestSecretsNotExposed(t *testing.T) {
	redistest.Require(t)
	const pw = "Tr0ub4dor-Secret-9"
	srv := redistest.Standalone(t, redistest.WithPassword(pw))
	cfgDir := t.TempDir()
	writeFile(t, cfgDir, "e2e.yaml", fmt.Sprintf(oneFile, 5))

	t.Run("url", func(t *testing.T) {
		p := start(t, startOpts{args: []string{"--config", cfgDir, "--backend=redis", "--redis-url", srv.URL(), "--redis-timeout=500ms",
			"--xds-headers=authorization:Bearer " + pw}})
		cc := p.dial(t)
		p.waitServing(t, cc, "ratelimitd.backend")
		if resp := call(t, cc, "e2e", desc("k", "a")); resp.GetStatuses()[0].GetLimitRemaining() != 4 {
			t.Fatalf("decision through the password URL: %v", resp)
		}
		code, body := httpGet(t, "http://"+p.debug+"/debug/pprof/cmdline")
		if code != 200 || !strings.Contains(body, "--redis-url") || !strings.Contains(body, "--xds-headers=authorization:xxxxx") || strings.Contains(body, pw) {
			t.Errorf("/debug/pprof/cmdline: %d %q; want the command line without the password", code, body)
		}
		if _, body := httpGet(t, "http://"+p.debug+"/rlconfig"); strings.Contains(body, pw) {
			t.Error("/rlconfig holds the password")
		}
		if _, body := httpGet(t, "http://"+p.http+"/metrics"); strings.Contains(body, pw) {
			t.Error("/metrics holds the password")
		}
		if logs := p.Logs(); strings.Contains(logs, pw) || !strings.Contains(logs, `"url":"redis://:xxxxx@`) {
			t.Errorf("logs leak the password or lack the redacted backend line:\n%s", logs)
		}
	})

	t.Run("password file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "redis-password")
		if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		p := start(t, startOpts{args: []string{"--config", cfgDir, "--backend=redis", "--redis-url", "redis://" + srv.Addr() + "/0",
			"--redis-password-file", file, "--redis-timeout=500ms"}})
		cc := p.dial(t)
		p.waitServing(t, cc, "ratelimitd.backend")
		if resp := call(t, cc, "e2e", desc("k", "b")); resp.GetStatuses()[0].GetLimitRemaining() != 4 {
			t.Fatalf("decision with --redis-password-file: %v", resp)
		}
		if n, err := srv.Client().DBSize(context.Background()).Result(); err != nil || n == 0 {
			t.Fatalf("no counter in Redis (%d keys, %v)", n, err)
		}
		if strings.Contains(p.Logs(), pw) {
			t.Error("logs hold the password read from the file")
		}
	})

	t.Run("startup errors", func(t *testing.T) {
		for name, c := range map[string]struct {
			args []string
			env  []string
		}{
			"bad port":            {args: []string{"--backend=redis", "--redis-url", "redis://user:" + pw + "@127.0.0.1:bad/0"}},
			"bad db":              {args: []string{"--backend=redis", "--redis-url", "redis://user:" + pw + "@127.0.0.1:6379/x"}},
			"sentinel auth":       {args: []string{"--backend=redis", "--redis-mode=sentinel", "--redis-sentinel-auth", "admin:" + pw}},
			"legacy REDIS_AUTH":   {env: []string{"REDIS_AUTH=" + pw, "REDIS_TYPE=sentinel", "REDIS_URL=onlymaster"}},
			"legacy REDIS_URL":    {env: []string{"REDIS_TYPE=sentinel", "REDIS_URL=redis://u:" + pw + "@h:1"}},
			"bad URL from env":    {env: []string{"RATELIMITD_BACKEND=redis", "RATELIMITD_REDIS_URL=redis://u:" + pw + "@[::1/0"}},
			"password file, auth": {args: []string{"--backend=redis", "--redis-sentinel-auth", pw, "--redis-sentinel-auth-file", "/nonexistent"}},
			"scheme typo":         {args: []string{"--backend=redis", "--redis-url", "redis//:" + pw + "@127.0.0.1:6379"}},
			"no scheme":           {args: []string{"--backend=redis", "--redis-url", ":" + pw + "@127.0.0.1:6379"}},
			"one slash":           {args: []string{"--backend=redis", "--redis-url", "redis:/:" + pw + "@127.0.0.1:6379"}},
			"extra colon":         {args: []string{"--backend=redis", "--redis-url", "redis:://:" + pw + "@127.0.0.1:6379"}},
			"no host":             {args: []string{"--backend=redis", "--redis-url", "redis://:" + pw + "@"}},
			"legacy scheme typo":  {env: []string{"BACKEND_TYPE=redis", "REDIS_URL=redis//:" + pw + "@127.0.0.1:6379"}},
			"legacy user info":    {env: []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=:" + pw + "@127.0.0.1:6379"}},
		} {
			args := append([]string{"serve", "--config", cfgDir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr="}, c.args...)
			code, stdout, stderr := runCmdRefused(t, c.env, args...)
			if code == 0 {
				t.Errorf("%s: started", name)
			}
			if strings.Contains(stdout+stderr, pw) {
				t.Errorf("%s: output leaks the password:\n%s", name, stderr)
			}
		}
	})
}

// runCmdRefused is runCmdEnv for a command line that must be refused at
// startup: a binary that starts serving instead is stopped after 20 s and
// reported with exit code 0, its output so far returned.
func runCmdRefused(t testing.TB, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = deploytest.CleanEnv(env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		return 0, out.String(), errb.String()
	}
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run %v: %v", args, err)
		}
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// dialTLS is a gRPC client of addr over TLS cfg, closed at cleanup.
func dialTLS(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
