package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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

// logRecords parses the JSON log lines of p (every line must be JSON: no
// library writes unstructured lines with --log-format=json).
func logRecords(t testing.TB, p *proc) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(p.Logs()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		out = append(out, rec)
	}
	return out
}

// countLogs counts the records with msg (prefix) and, when attrs are
// given, those attribute values.
func countLogs(t testing.TB, p *proc, msgPrefix string, attrs map[string]any) int {
	t.Helper()
	n := 0
	for _, rec := range logRecords(t, p) {
		msg, _ := rec["msg"].(string)
		if !strings.HasPrefix(msg, msgPrefix) {
			continue
		}
		ok := true
		for k, v := range attrs {
			if rec[k] != v {
				ok = false
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// logCount is countLogs once at least want records match, or after 20 s:
// a line the process wrote before a state the test observed (health,
// an answer) can reach the log reader after it.
func logCount(t testing.TB, p *proc, msgPrefix string, attrs map[string]any, want int) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n := countLogs(t, p, msgPrefix, attrs); n >= want || time.Now().After(deadline) {
			return n
		}
	}
}

// TestSIGHUPReloads: SIGHUP reloads the config and the process keeps running.
func TestSIGHUPReloads(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 5))
	p := start(t, startOpts{args: []string{"--config", filepath.Join(dir, "e2e.yaml"), "--log-level=debug"}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The same content: reloaded and found unchanged (nothing replaced).
	eventually(t, settleWithin, func() string {
		if n := countLogs(t, p, "config unchanged", nil); n < 1 {
			return "no reload logged after SIGHUP\n" + p.Logs()
		}
		return ""
	})
	if logCount(t, p, "SIGHUP: reloading config", nil, 1) != 1 {
		t.Errorf("SIGHUP not logged\n%s", p.Logs())
	}
	if logCount(t, p, "config loaded", map[string]any{"first": true}, 1) != 1 {
		t.Errorf("want exactly one first=true load\n%s", p.Logs())
	}
	select {
	case <-p.Done():
		t.Fatalf("exited after SIGHUP: %v\n%s", p.Err(), p.Logs())
	default:
	}
	if got := call(t, cc, "e2e", desc("k", "x")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 5 {
		t.Errorf("limit %d after SIGHUP, want 5", got)
	}
}

// TestEmptyConfig: an empty config directory is a valid, empty config:
// SERVING, every request OK, and a WARN on each such load. Deleting the
// last file of a watched directory loads the empty config; deleting a file
// given directly keeps the last good config.
func TestEmptyConfig(t *testing.T) {
	dir := t.TempDir()
	p := start(t, startOpts{args: []string{"--config", dir}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	want := "no rate-limit domains loaded from " + dir
	if logCount(t, p, want, map[string]any{"level": "WARN"}, 1) != 1 {
		t.Errorf("no WARN %q\n%s", want, p.Logs())
	}
	if resp := call(t, cc, "e2e", desc("k", "x")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Errorf("empty config: %v", resp)
	}

	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 5))
	limit := func() uint32 {
		return call(t, cc, "e2e", desc("k", "x")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	eventually(t, settleWithin, func() string {
		if got := limit(); got != 5 {
			return fmt.Sprintf("limit %d, want 5", got)
		}
		return ""
	})
	if err := os.Remove(filepath.Join(dir, "e2e.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, settleWithin, func() string {
		if got := limit(); got != 0 {
			return fmt.Sprintf("limit %d after deleting the directory's last file, want none", got)
		}
		return ""
	})
	if n := logCount(t, p, want, map[string]any{"level": "WARN"}, 2); n != 2 {
		t.Errorf("%d empty-config warnings, want 2\n%s", n, p.Logs())
	}
	if got := health(t, cc, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health %v with an empty config, want SERVING", got)
	}

	// A file given directly: deleting it is an error, the config stays.
	fdir := t.TempDir()
	writeFile(t, fdir, "one.yaml", fmt.Sprintf(oneFile, 7))
	q := start(t, startOpts{args: []string{"--config", filepath.Join(fdir, "one.yaml")}})
	qc := q.dial(t)
	q.waitServing(t, qc, "")
	if err := os.Remove(filepath.Join(fdir, "one.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, settleWithin, func() string {
		if countLogs(t, q, "config files could not be read; keeping the config in force", nil) == 0 {
			return "deleting the file was not rejected\n" + q.Logs()
		}
		return ""
	})
	if got := call(t, qc, "e2e", desc("k", "x")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 7 {
		t.Errorf("limit %d after deleting the file given directly, want the last good 7", got)
	}
}

// TestFirstLoadLogging: before any config loaded, a rejected config does
// not claim to keep a "last good config"; the first good load logs
// first=true.
func TestFirstLoadLogging(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", "domain: e2e\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	p := start(t, startOpts{args: []string{"--config", dir}})
	eventually(t, settleWithin, func() string {
		if countLogs(t, p, "config rejected; no config loaded yet", map[string]any{"level": "ERROR"}) == 0 {
			return "no rejection logged\n" + p.Logs()
		}
		return ""
	})
	if strings.Contains(p.Logs(), "last good config") {
		t.Errorf("claims a last good config before any load\n%s", p.Logs())
	}
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 5))
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	if n := logCount(t, p, "config loaded", map[string]any{"first": true}, 1); n != 1 {
		t.Errorf("%d first=true loads, want 1\n%s", n, p.Logs())
	}
}

// TestMemoryMaxKeys: --memory-max-keys bounds the memory store, and a full
// store switches no limit off: after two values fill it, a third value of a
// 10-per-minute rule with the default failure_mode open, called 30 times at
// once, is admitted exactly 10 times (decided by the store's sketch,
// counted in ratelimitd_memory_full_hits_total), not 30 by the failure
// mode.
func TestMemoryMaxKeys(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", "domain: e2e\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	p := start(t, startOpts{args: []string{"--config", dir, "--memory-max-keys=2"}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	for i, v := range []string{"a", "b", "a", "b"} {
		if resp := call(t, cc, "e2e", desc("k", v)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d (%s): %v, want OK", i, v, resp.GetOverallCode())
		}
	}
	var ok atomic.Int64
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "c")}})
			if err != nil {
				t.Error(err)
			} else if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 {
		t.Errorf("a new value with the store full: %d of 30 admitted on a 10-per-minute rule, want 10", ok.Load())
	}
	_, m := httpGet(t, "http://"+p.http+"/metrics")
	if v := metricValue(m, `ratelimitd_memory_full_hits_total{decision="sketched",store="backend"}`); v != 10 {
		t.Errorf(`ratelimitd_memory_full_hits_total{decision="sketched",store="backend"} = %v, want 10 (the admitted hits)`, v)
	}
	if v := metricValue(m, `ratelimitd_backend_errors_total{cause="oom"}`); v != 0 {
		t.Errorf(`ratelimitd_backend_errors_total{cause="oom"} = %v, want 0: a full store fails no call`, v)
	}
}

// TestRedisLogsAreStructured: with --log-format=json every line is JSON,
// go-redis' own pool errors included, and they are rate-limited; a
// misspelled RATELIMITD_* variable is named in a startup warning.
func TestRedisLogsAreStructured(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 5))
	p := start(t, startOpts{
		args: []string{"--config", dir, "--backend=redis", "--redis-url=redis://127.0.0.1:" + freePort(t), "--redis-timeout=50ms"},
		env:  []string{"RATELIMITD_REDIS_ULR=redis://typo:6379"},
	})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	for range 20 {
		call(t, cc, "e2e", desc("k", "x")) // fail open: the backend is down
	}
	// go-redis' pool dials in the background: wait for its first logged
	// error rather than for a fixed time.
	eventually(t, settleWithin, func() string {
		if countLogs(t, p, "redis client", map[string]any{"level": "WARN"}) == 0 {
			return "go-redis' dial errors were not logged as \"redis client\" records\n" + p.Logs()
		}
		return ""
	})
	recs := logRecords(t, p)
	warned := false
	for _, r := range recs {
		if msg, _ := r["msg"].(string); strings.Contains(msg, "match no serve flag") && strings.Contains(msg, "RATELIMITD_REDIS_ULR") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning naming RATELIMITD_REDIS_ULR\n%s", p.Logs())
	}
	if _, m := httpGet(t, "http://"+p.http+"/metrics"); !strings.Contains(m, "ratelimitd_backend_circuit_state{") {
		t.Errorf("no ratelimitd_backend_circuit_state in /metrics with the Redis backend")
	}
	warns := countLogs(t, p, "redis client", map[string]any{"level": "WARN"})
	kinds := map[string]bool{}
	for _, r := range recs {
		if r["msg"] == "redis client" && r["level"] == "WARN" {
			line, _ := r["line"].(string)
			kinds[strings.SplitN(line, ":", 2)[0]] = true
		}
	}
	if warns == 0 {
		t.Errorf("go-redis' dial errors were not logged as \"redis client\" records\n%s", p.Logs())
	}
	if warns > 3*len(kinds)+3 {
		t.Errorf("%d WARN lines from go-redis (kinds %v): not rate-limited\n%s", warns, kinds, p.Logs())
	}
}

// TestMakeRunStops: `make run` execs the server: a SIGTERM to make reaches
// it, and it exits (its ports are free again) instead of being orphaned.
func TestMakeRunStops(t *testing.T) {
	if testing.Short() {
		t.Skip("builds with make")
	}
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Fatalf("make not installed: the README's first command needs it: %v", err)
	}
	built := filepath.Join(t.TempDir(), "ratelimitd")
	cmd := exec.Command(makeBin, "-s", "run", "BIN="+built,
		"RUN_ARGS=--grpc-addr=127.0.0.1:0 --http-addr=127.0.0.1:0 --debug-addr= --log-format=json")
	cmd.Dir = repoRoot(t)
	cmd.Env = deploytest.CleanEnv("GOFLAGS="+os.Getenv("GOFLAGS"), "GOCACHE="+goEnv(t, "GOCACHE"), "GOPATH="+goEnv(t, "GOPATH"))
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// The server is make's child (exec): find it by its parent. make
	// builds it first, which can take minutes: no time bound but the
	// test's own, as long as make runs.
	var server int
	for server == 0 {
		select {
		case err := <-done:
			t.Fatalf("make run ended (%v) without starting the server\n%s", err, logs.String())
		default:
		}
		server = childRunning(cmd.Process.Pid, built)
		time.Sleep(100 * time.Millisecond)
	}
	// Wait until it serves (the listening lines), then SIGTERM make only.
	for deadline := time.Now().Add(settleWithin); !strings.Contains(logs.String(), `"config loaded"`) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(server, syscall.SIGKILL)
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("make run did not end 30s after SIGTERM\n%s", logs.String())
	}
	if err := syscall.Kill(server, 0); err == nil {
		_ = syscall.Kill(server, syscall.SIGKILL)
		t.Errorf("server %d still running after make got SIGTERM (orphaned)", server)
	}
	if !strings.Contains(logs.String(), `"stopped"`) {
		t.Errorf("server did not shut down gracefully\n%s", logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for exec's copying goroutine and the
// test reading it.
type syncBuffer = testproc.Buffer

// childRunning returns the pid of a child of parent running exe, or 0.
func childRunning(parent int, exe string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", parent, parent))
	if err != nil {
		return 0
	}
	for _, f := range strings.Fields(string(b)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err != nil {
			continue
		}
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && target == exe {
			return pid
		}
	}
	return 0
}

func goEnv(t testing.TB, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestServiceFlagsWired: the service options exposed as serve flags reach
// the responses.
func TestServiceFlagsWired(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", "domain: e2e\ndescriptors:\n  - key: k\n    rate_limit: {name: one, unit: minute, requests_per_unit: 1}\n")
	p := start(t, startOpts{args: []string{"--config", dir, "--near-limit-header", "--retry-jitter=0s",
		"--problem-type-base=https://errors.example/", "--problem-detail={policy}: {quota} per {window}s"}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	header := func(resp *rlsv3.RateLimitResponse, name string) string {
		for _, h := range resp.GetResponseHeadersToAdd() {
			if strings.EqualFold(h.GetKey(), name) {
				return h.GetValue()
			}
		}
		return ""
	}
	first := call(t, cc, "e2e", desc("k", "x"))
	if got := header(first, "Ratelimitd-Near-Limit"); got != `"one"` {
		t.Errorf("Ratelimitd-Near-Limit %q, want \"one\" (--near-limit-header)", got)
	}
	second := call(t, cc, "e2e", desc("k", "x"))
	if second.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second call %v, want OVER_LIMIT", second.GetOverallCode())
	}
	var body struct{ Type, Detail string }
	if err := json.Unmarshal(second.GetRawBody(), &body); err != nil {
		t.Fatalf("raw body %q: %v", second.GetRawBody(), err)
	}
	if body.Type != "https://errors.example/quota-exceeded" || body.Detail != "one: 1 per 60s" {
		t.Errorf("problem type %q detail %q (--problem-type-base, --problem-detail)", body.Type, body.Detail)
	}
}

// waitRefusedAtStart waits until p logged refused and checks that, with
// only the refused config, it is not SERVING.
func waitRefusedAtStart(t *testing.T, p *proc, cc *grpc.ClientConn, refused string) {
	t.Helper()
	eventually(t, settleWithin, func() string {
		if !strings.Contains(p.Logs(), refused) {
			return "no refusal logged\n" + p.Logs()
		}
		return ""
	})
	if got := health(t, cc, ""); got == healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("SERVING with a refused config only")
	}
}

// reloadRefused writes content to dir/name while p serves a config whose
// rule k allows 5 in domain, waits until p logged refused a second time
// (the first was at startup), and checks that k still allows 5: the
// config in force stays.
func reloadRefused(t *testing.T, p *proc, cc *grpc.ClientConn, dir, name, content, refused, domain string) {
	t.Helper()
	writeFile(t, dir, name, content)
	eventually(t, settleWithin, func() string {
		if n := strings.Count(p.Logs(), refused); n < 2 {
			return fmt.Sprintf("%d refusals logged, want 2\n%s", n, p.Logs())
		}
		return ""
	})
	if got := call(t, cc, domain, desc("k", "x")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 5 {
		t.Errorf("limit %d after a refused reload, want 5 (the config in force)", got)
	}
}

// TestMaxConfigRules: --max-config-rules refuses a config with more rules
// at startup (not serving) and at reload (the config in force stays), with
// an ERROR naming both counts.
func TestMaxConfigRules(t *testing.T) {
	dir := t.TempDir()
	two := fmt.Sprintf(oneFile, 5) + "  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	writeFile(t, dir, "e2e.yaml", two)
	p := start(t, startOpts{args: []string{"--config", dir, "--max-config-rules=1"}})
	cc := p.dial(t)
	const refused = "config too large: 2 rules, more than the limit of 1 (--max-config-rules)"
	waitRefusedAtStart(t, p, cc, refused)
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 5))
	p.waitServing(t, cc, "")
	reloadRefused(t, p, cc, dir, "e2e.yaml", two, refused, "e2e")
}

// TestMaxConfigBytes: --max-config-bytes refuses a config larger than the
// limit before parsing.
func TestMaxConfigBytes(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 5))
	p := start(t, startOpts{args: []string{"--config", dir, "--max-config-bytes=20"}})
	cc := p.dial(t)
	const refused = "config too large: more than the limit of 20 bytes (--max-config-bytes)"
	waitRefusedAtStart(t, p, cc, refused)
}
