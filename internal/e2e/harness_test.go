// Package e2e builds the ratelimitd binary and tests it as a user does:
// real processes, real listeners on loopback, real gRPC and HTTP clients.
package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

// Build-time values checked by TestVersion.
const (
	testVersion = "v0.0.0-e2e"
	testCommit  = "e2ecommit"
)

// bin is the ratelimitd binary built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	flags := []string{"-ldflags", "-X main.version=" + testVersion + " -X main.commit=" + testCommit}
	if raceEnabled {
		flags = append(flags, "-race")
	}
	os.Exit(deploytest.BuildMain(m, "e2e", &bin, flags...))
}

// repoRoot is the module root (tests run in internal/e2e).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// proc is a running ratelimitd serve.
type proc struct {
	*deploytest.Serve
	grpc  string // host:port
	http  string
	debug string

	stopOnce sync.Once
}

// startOpts configure start.
type startOpts struct {
	args []string // after "serve"
	env  []string // added to deploytest.CleanEnv
	// legacyAddrs: the addresses come from the environment, not flags.
	legacyAddrs bool
	// ports, when set, is more environment, called on each start: the
	// listener variables on fresh ports (freePort), so that a start
	// whose process found one taken is repeated on others.
	ports func() []string
}

// start runs `ratelimitd serve` with loopback listeners on free ports and
// waits (up to 20 s) until it logs its listen addresses. The process is
// stopped at cleanup: SIGTERM, and an error unless it exits 0 within 20 s.
func start(t testing.TB, o startOpts) *proc {
	t.Helper()
	args := []string{"serve", "--log-format=json", "--log-level=debug"}
	if !o.legacyAddrs {
		args = append(args, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=127.0.0.1:0")
	}
	args = append(args, o.args...)
	env := o.env
	var s *deploytest.Serve
	err := testproc.StartRetrying("ratelimitd serve", func() error {
		if o.ports != nil {
			env = append(append([]string{}, o.env...), o.ports()...)
		}
		var err error
		s, err = deploytest.StartServe(bin, args, deploytest.CleanEnv(env...), []string{deploytest.GRPC, deploytest.HTTP, deploytest.Debug}, 20*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{Serve: s, grpc: s.Addrs[deploytest.GRPC], http: s.Addrs[deploytest.HTTP], debug: s.Addrs[deploytest.Debug]}
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop stops the process (deploytest.Serve.Stop with 20 s of grace) and
// fails t for an unclean exit; later calls do nothing.
func (p *proc) stop(t testing.TB) {
	p.stopOnce.Do(func() {
		if err := p.Stop(20 * time.Second); err != nil {
			t.Error(err)
		}
	})
}

// terminate sends SIGTERM and returns a channel closed when the process
// exited.
func (p *proc) terminate() <-chan struct{} {
	_ = p.Signal(syscall.SIGTERM)
	return p.Done()
}

// exitCode waits (bounded) for the process and returns its exit code.
func (p *proc) exitCode(t testing.TB, within time.Duration) int {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(within):
		t.Fatalf("ratelimitd still running after %v\n%s", within, p.Logs())
	}
	return p.Cmd.ProcessState.ExitCode()
}

// dial opens a gRPC client connection to the process, closed at cleanup.
func (p *proc) dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	return testproc.Dial(t, p.grpc)
}

// waitServing polls grpc.health.v1 for service until SERVING (up to 20 s).
func (p *proc) waitServing(t testing.TB, cc *grpc.ClientConn, service string) {
	t.Helper()
	if err := testproc.WaitHealth(cc, service, healthpb.HealthCheckResponse_SERVING, 20*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, p.Logs())
	}
}

// health returns the gRPC health status of service.
func health(t testing.TB, cc *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	st, err := testproc.Health(cc, service)
	if err != nil {
		t.Fatalf("health check %q: %v", service, err)
	}
	return st
}

// desc builds a descriptor from key, value pairs.
var desc = testproc.Desc

// call sends one ShouldRateLimit.
func call(t testing.TB, cc *grpc.ClientConn, domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s): %v", domain, err)
	}
	return resp
}

// httpGet returns status and body of GET url.
func httpGet(t testing.TB, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// httpPost returns status and body of POST url with a JSON body.
func httpPost(t testing.TB, url, body string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// writeFile writes name under dir atomically (write then rename, as
// editors and ConfigMap updates do).
func writeFile(t testing.TB, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// freePort returns a loopback port that was free a moment ago, one no
// other freePort of this process returns.
func freePort(t testing.TB) string {
	t.Helper()
	return deploytest.FreePorts(t, 1)[0]
}

// settleWithin bounds, in real time, the waits of eventually for a state
// the process reaches on its own (a reloaded config, a log line, a
// backend back): generous, so that slow scheduling passes and a process
// that never gets there fails. How soon it happens is the benchmarks'
// measure (BenchmarkHotReload).
const settleWithin = 30 * time.Second

// eventually retries f every 20ms until it returns "" or within elapses;
// it then fails with f's last message.
func eventually(t testing.TB, within time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runCmd runs the binary with args and returns exit code, stdout, stderr.
func runCmd(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	return runCmdEnv(t, nil, args...)
}

// runCmdEnv is runCmd with env added to deploytest.CleanEnv.
func runCmdEnv(t testing.TB, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = deploytest.CleanEnv(env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run %v: %v", args, err)
		}
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}
