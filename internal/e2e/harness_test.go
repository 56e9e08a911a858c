// Package e2e builds the ratelimitd binary and tests it as a user does:
// real processes, real listeners on loopback, real gRPC and HTTP clients.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
	var out []byte
	var err error
	if bin, out, err = deploytest.Build(flags...); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build: %v\n%s", err, out)
		deploytest.RemoveBuilds()
		os.Exit(1)
	}
	code := m.Run()
	deploytest.RemoveBuilds()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
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

// baseEnv is a clean environment for the child: no RATELIMITD_* or
// envoyproxy/ratelimit variables leak in from the test's environment.
func baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}
}

// proc is a running ratelimitd serve.
type proc struct {
	t     testing.TB
	cmd   *exec.Cmd
	grpc  string // host:port
	http  string
	debug string

	logs deploytest.SyncBuffer
	done chan struct{}
	err  error // Wait's result, after done
}

// startOpts configure start.
type startOpts struct {
	args []string // after "serve"
	env  []string // added to baseEnv
	// legacyAddrs: the addresses come from the environment, not flags.
	legacyAddrs bool
}

// start runs `ratelimitd serve` with loopback listeners on free ports and
// waits until it logs its listen addresses. The process is stopped (SIGTERM,
// then SIGKILL) at cleanup.
func start(t testing.TB, o startOpts) *proc {
	t.Helper()
	args := []string{"serve", "--log-format=json", "--log-level=debug"}
	if !o.legacyAddrs {
		args = append(args, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=127.0.0.1:0")
	}
	args = append(args, o.args...)
	p := &proc{t: t, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(baseEnv(), o.env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrs := make(chan deploytest.Listening, 8)
	go func() {
		deploytest.ScanLog(stderr, &p.logs, addrs)
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	deadline := time.After(20 * time.Second)
	for p.grpc == "" || p.http == "" || p.debug == "" {
		select {
		case a := <-addrs:
			switch a.Server {
			case "grpc":
				p.grpc = a.Addr
			case "http":
				p.http = a.Addr
			case "debug":
				p.debug = a.Addr
			}
		case <-p.done:
			t.Fatalf("ratelimitd exited during startup: %v\n%s", p.err, p.Logs())
		case <-deadline:
			t.Fatalf("ratelimitd did not log its listeners\n%s", p.Logs())
		}
	}
	return p
}

// Logs returns everything the process wrote to stderr so far.
func (p *proc) Logs() string {
	return p.logs.String()
}

// signal sends SIGTERM and returns a channel closed when the process exited.
func (p *proc) terminate() <-chan struct{} {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.done
}

// exitCode waits (bounded) for the process and returns its exit code.
func (p *proc) exitCode(t testing.TB, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("ratelimitd still running after %v\n%s", within, p.Logs())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		// A clean shutdown exits 0; a -race binary exits 66 after a race.
		if code := p.cmd.ProcessState.ExitCode(); code != 0 || strings.Contains(p.Logs(), "DATA RACE") {
			t.Errorf("ratelimitd exited %d after SIGTERM\n%s", code, p.Logs())
		}
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("ratelimitd ignored SIGTERM for 20s\n%s", p.Logs())
	}
}

// dial opens a gRPC client connection to the process, closed at cleanup.
func (p *proc) dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// waitServing polls grpc.health.v1 for service until SERVING.
func (p *proc) waitServing(t testing.TB, cc *grpc.ClientConn, service string) {
	t.Helper()
	hc := healthpb.NewHealthClient(cc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health %q not SERVING after 20s (last: %v, %v)\n%s", service, resp.GetStatus(), err, p.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// health returns the gRPC health status of service.
func health(t testing.TB, cc *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health check %q: %v", service, err)
	}
	return resp.GetStatus()
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

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

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) string {
	t.Helper()
	_, port, _ := net.SplitHostPort(deploytest.FreeAddr(t))
	return port
}

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

// runCmdEnv is runCmd with env added to baseEnv.
func runCmdEnv(t testing.TB, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(baseEnv(), env...)
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
