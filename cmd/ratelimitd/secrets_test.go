package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestCmdlineRedactedOverHTTP: a server started with a credential in every
// flag that can carry one serves /debug/pprof/cmdline, over HTTP on its
// debug listener, with none of them, and logs none of them; the flags
// themselves and the other values are still there.
func TestCmdlineRedactedOverHTTP(t *testing.T) {
	redistest.Require(t)
	const redisPW = "RedisPw-7q"
	srv := redistest.Standalone(t, redistest.WithPassword(redisPW))
	secrets := []string{redisPW, "BearerTok-9z", "ApiKey-3k", "SentinelPw-5m", "MemcPw-2x", "XdsPw-4d", "OtlpPw-6c"}
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "c.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	args := []string{
		"--backend=redis",
		"--redis-url", "redis://default:" + redisPW + "@" + srv.Addr() + "/0",
		"--xds-headers=authorization:Bearer BearerTok-9z,x-api-key:ApiKey-3k",
		"-redis-sentinel-auth", "admin:SentinelPw-5m",
		"--memcache-addrs=u:MemcPw-2x@127.0.0.1:11211",
		"--xds-server-url=dns://x:XdsPw-4d@xds.example:18000",
		"--tracing-endpoint=http://o:OtlpPw-6c@127.0.0.1:4317",
		"--config=" + dir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=127.0.0.1:0", "--shutdown-grace=5s",
	}
	o, _, err := serveopts.Parse(args, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The debug listener serves the process's command line (os.Args).
	saved := os.Args
	os.Args = append([]string{"ratelimitd", "serve"}, args...)
	defer func() { os.Args = saved }()
	logs := &testproc.Buffer{}
	s, err := newServer(o, gcpolicy.Policy{PercentSource: gcpolicy.SourceEnv, LimitSource: gcpolicy.SourceEnv}, nil, logs)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- s.Run(context.Background()) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-ran
	}()
	resp, err := http.Get("http://" + s.debugLn.Addr().String() + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /debug/pprof/cmdline: %d %v", resp.StatusCode, err)
	}
	body := string(b)
	for _, sec := range secrets {
		if strings.Contains(body, sec) {
			t.Errorf("/debug/pprof/cmdline shows %q: %q", sec, body)
		}
		if strings.Contains(logs.String(), sec) {
			t.Errorf("the log holds %q", sec)
		}
	}
	for _, want := range []string{"\x00--redis-url\x00redis://default:xxxxx@" + srv.Addr() + "/0\x00", "--xds-headers=authorization:xxxxx,x-api-key:xxxxx", "\x00admin:", "--memcache-addrs=xxxxx\x00", "--xds-server-url=dns://xxxxx@xds.example:18000", "--config=" + dir} {
		if want == "\x00admin:" {
			if !strings.Contains(body, "-redis-sentinel-auth\x00xxxxx\x00") {
				t.Errorf("cmdline %q: want -redis-sentinel-auth's value redacted in place", body)
			}
			continue
		}
		if !strings.Contains(body, want) {
			t.Errorf("cmdline %q lacks %q", body, want)
		}
	}
	if !strings.Contains(logs.String(), "url=redis://default:xxxxx@"+srv.Addr()+"/0") {
		t.Errorf("startup log does not name the Redis URL redacted:\n%s", logs.String())
	}
}
