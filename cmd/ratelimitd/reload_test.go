package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/health"

	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// resetStore is a memory store that counts ResetCache calls (the Redis
// store's over-limit cache reset on a config change).
type resetStore struct {
	*memory.Store
	resets atomic.Int64
}

func (s *resetStore) ResetCache() { s.resets.Add(1) }

// levelLog counts log records at INFO and above.
type levelLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *levelLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *levelLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelInfo {
		l.mu.Lock()
		l.msgs = append(l.msgs, r.Level.String()+" "+r.Message)
		l.mu.Unlock()
	}
	return nil
}
func (l *levelLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levelLog) WithGroup(string) slog.Handler      { return l }
func (l *levelLog) infoAndAbove() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// reloadEnv is a server whose config is reloaded by policy.Watch, as serve
// wires it, with a detailed_metric label budget of 1.
type reloadEnv struct {
	s     *server
	store *resetStore
	reg   *prometheus.Registry
	logs  *levelLog
}

func newReloadEnv(t *testing.T, opts policy.LoadOptions, paths ...string) *reloadEnv {
	t.Helper()
	e := &reloadEnv{store: &resetStore{Store: memoryStore(t)}, reg: prometheus.NewRegistry(), logs: &levelLog{}}
	svc := newTestService(t, service.Options{Store: e.store, Registerer: e.reg, DetailedMetricCap: 1})
	e.s = &server{log: slog.New(e.logs), svc: svc, store: e.store, health: health.NewServer()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- policy.Watch(ctx, opts, paths, e.s.apply, e.s.fail) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	})
	return e
}

// reloads returns ratelimitd_config_reloads_total by result.
func (e *reloadEnv) reloads(t *testing.T) map[string]float64 {
	t.Helper()
	return counterByLabel(t, e.reg, "ratelimitd_config_reloads_total", "result")
}

// waitReloads polls until result has reached n (a generous bound, so
// that slow scheduling does not fail it) and returns all counts.
func (e *reloadEnv) waitReloads(t *testing.T, result string, n float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := e.reloads(t)
		if r[result] >= n {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("reloads %v: %s did not reach %v within 10s", r, result, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// want checks the reload counts (absent results count 0) and the number of
// ResetCache calls.
func (e *reloadEnv) want(t *testing.T, got map[string]float64, want map[string]float64, resets int64) {
	t.Helper()
	for _, r := range []string{"success", "unchanged", "failure", "read_error", "watch_error"} {
		if got[r] != want[r] {
			t.Errorf("reloads{result=%q} = %v, want %v (all: %v)", r, got[r], want[r], got)
		}
	}
	if n := e.store.resets.Load(); n != resets {
		t.Errorf("ResetCache called %d times, want %d", n, resets)
	}
}

// hit sends one request for user and returns the rule labels of
// ratelimitd_decisions_total seen so far, sorted.
func (e *reloadEnv) hit(t *testing.T, user string) []string {
	t.Helper()
	_, err := e.s.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain:      "d",
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := counterByLabel(t, e.reg, "ratelimitd_decisions_total", "rule")
	var out []string
	for r := range seen {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}

func userConfig(rpu int) string {
	return fmt.Sprintf("domain: d\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", rpu)
}

// replaceFile renames a temporary file with content over p (one event on
// p, as editors do); the temporary name is not a config file.
func replaceFile(t *testing.T, p, content string) {
	t.Helper()
	tmp := p + ".tmp"
	writeTestFile(t, tmp, content)
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

func (e *reloadEnv) rpu(t *testing.T) uint32 {
	t.Helper()
	rules := e.s.svc.Policy().Rules()
	if len(rules) != 1 || len(rules[0].Limits) != 1 {
		t.Fatalf("rules in force: %v", rules)
	}
	return rules[0].Limits[0].RequestsPerUnit
}

// TestReloadIdempotent: with --config FILE, a log file written next to it
// reloads nothing; the same content again (touched, or renamed into place)
// keeps the over-limit cache and counts as "unchanged"; a real change
// applies exactly once and grants no new detailed_metric labels (the
// budget is the process's); a rejected
// config and a read error never replace the config in force and count
// apart; restoring the content in force after them is a no-op.
func TestReloadIdempotent(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	writeTestFile(t, file, userConfig(100))
	e := newReloadEnv(t, policy.LoadOptions{}, file)
	e.want(t, e.waitReloads(t, "success", 1), map[string]float64{"success": 1}, 1)
	e.hit(t, "a")
	if got := e.hit(t, "b"); strings.Join(got, ",") != "_other,d.user_a" {
		t.Fatalf("rule labels %v, want a's own label and _other (budget 1)", got)
	}
	logsBefore := len(e.logs.infoAndAbove())

	// A log file next to the config, written many times, and a touch.
	lf, err := os.OpenFile(filepath.Join(dir, "ratelimitd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		if _, err := fmt.Fprintf(lf, "line %d\n", i); err != nil {
			t.Fatal(err)
		}
	}
	if err := lf.Close(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := os.Chtimes(file, now, now); err != nil {
		t.Fatal(err)
	}
	// The same content renamed into place: one load, after the events
	// above, which finds nothing to apply.
	replaceFile(t, file, userConfig(100))
	e.want(t, e.waitReloads(t, "unchanged", 1), map[string]float64{"success": 1, "unchanged": 1}, 1)
	if got := e.hit(t, "c"); strings.Join(got, ",") != "_other,d.user_a" {
		t.Errorf("rule labels after a no-op reload %v, want the budget kept (c counted as _other)", got)
	}
	if logs := e.logs.infoAndAbove(); len(logs) != logsBefore {
		t.Errorf("no-op reload logged above debug: %v", logs[logsBefore:])
	}

	// A real change: applied once, the cache reset once, the label
	// budget kept.
	replaceFile(t, file, userConfig(200))
	e.waitReloads(t, "success", 2)
	replaceFile(t, file, userConfig(200)) // barrier: a no-op after it
	e.want(t, e.waitReloads(t, "unchanged", 2), map[string]float64{"success": 2, "unchanged": 2}, 2)
	if got := e.rpu(t); got != 200 {
		t.Errorf("requests_per_unit in force %d, want 200", got)
	}
	if got := e.hit(t, "d"); strings.Join(got, ",") != "_other,d.user_a" {
		t.Errorf("rule labels after a change %v, want the budget kept (d counted as _other)", got)
	}

	// A rejected config keeps the one in force; restoring it is a no-op.
	replaceFile(t, file, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	e.waitReloads(t, "failure", 1)
	replaceFile(t, file, userConfig(200))
	e.want(t, e.waitReloads(t, "unchanged", 3), map[string]float64{"success": 2, "unchanged": 3, "failure": 1}, 2)

	// A read error (the file removed) is not a rejected config.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	r := e.waitReloads(t, "read_error", 1)
	if r["failure"] != 1 || e.rpu(t) != 200 {
		t.Errorf("after removing the file: reloads %v, requests_per_unit %d; want failure still 1 and 200 in force", r, e.rpu(t))
	}
	replaceFile(t, file, userConfig(200))
	r = e.waitReloads(t, "unchanged", 4)
	if r["success"] != 2 || r["failure"] != 1 || r["watch_error"] != 0 || e.store.resets.Load() != 2 {
		t.Errorf("after restoring the file: reloads %v, %d resets; want success 2, failure 1, 2 resets", r, e.store.resets.Load())
	}
}

// TestReloadConfigMapSwap: a ConfigMap-style ..data swap applies exactly
// once per content change (a swap to the same content is a no-op), with
// --config the directory or its config.yaml symlink.
func TestReloadConfigMapSwap(t *testing.T) {
	for _, mode := range []string{"dir", "file"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			n := 0
			swap := func(content string) {
				t.Helper()
				n++
				ts := fmt.Sprintf("..2026_11_30_%02d", n)
				if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
					t.Fatal(err)
				}
				writeTestFile(t, filepath.Join(dir, ts, "config.yaml"), content)
				old, _ := os.Readlink(filepath.Join(dir, "..data"))
				tmp := filepath.Join(dir, "..data_tmp")
				if err := os.Symlink(ts, tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
					t.Fatal(err)
				}
				if old != "" {
					if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
						t.Fatal(err)
					}
				}
			}
			swap(userConfig(100))
			if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
				t.Fatal(err)
			}
			path := dir
			if mode == "file" {
				path = filepath.Join(dir, "config.yaml")
			}
			e := newReloadEnv(t, policy.LoadOptions{IgnoreDotFiles: true}, path)
			e.want(t, e.waitReloads(t, "success", 1), map[string]float64{"success": 1}, 1)

			swap(userConfig(200))
			e.waitReloads(t, "success", 2)
			swap(userConfig(200)) // same content: no-op
			e.waitReloads(t, "unchanged", 1)
			// Barrier: a rejected config, seen after every event above.
			swap("domain: [broken\n")
			r := e.waitReloads(t, "failure", 1)
			if r["success"] != 2 || e.store.resets.Load() != 2 {
				t.Errorf("reloads %v, %d resets; want success 2, 2 resets", r, e.store.resets.Load())
			}
			if got := e.rpu(t); got != 200 {
				t.Errorf("requests_per_unit in force %d, want 200", got)
			}
			swap(userConfig(300))
			e.waitReloads(t, "success", 3)
			if got := e.rpu(t); got != 300 {
				t.Errorf("requests_per_unit in force %d, want 300", got)
			}
		})
	}
}

// TestReloadFailAccounting: fail counts a watcher error, a read error and
// a rejected config under their own results, and none replaces the config
// in force.
func TestReloadFailAccounting(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	writeTestFile(t, file, userConfig(100))
	e := newReloadEnv(t, policy.LoadOptions{}, file)
	e.waitReloads(t, "success", 1)
	inForce := e.s.svc.Policy()

	e.s.fail(&policy.WatchError{Err: fsnotify.ErrEventOverflow})
	_, _, readErr := policy.Load(policy.LoadOptions{}, filepath.Join(dir, "missing.yaml"))
	e.s.fail(readErr)
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeTestFile(t, bad, "domain: [broken\n")
	_, _, badErr := policy.Load(policy.LoadOptions{}, bad)
	e.s.fail(badErr)
	e.want(t, e.reloads(t), map[string]float64{"success": 1, "watch_error": 1, "read_error": 1, "failure": 1}, 1)
	if e.s.svc.Policy() != inForce {
		t.Errorf("a failed load replaced the config in force")
	}
	logs := strings.Join(e.logs.infoAndAbove(), "\n")
	for _, m := range []string{"WARN config watcher error", "WARN config files could not be read", "ERROR config rejected"} {
		if !strings.Contains(logs, m) {
			t.Errorf("no log line %q in:\n%s", m, logs)
		}
	}
}

// usersConfig is domain d with n rules (user values u0 … u<n-1>).
func usersConfig(n int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - key: user\n    value: u%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, i+1)
	}
	return b.String()
}

// TestReloadMaxConfigRules: --max-config-rules refuses a config with more
// rules at startup (nothing in force, not serving) and at reload (the
// config in force stays), with an error naming both counts.
func TestReloadMaxConfigRules(t *testing.T) {
	o, _, err := serveopts.Parse(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxConfigRules != 50_000 || o.MaxConfigBytes != 8<<20 {
		t.Fatalf("--max-config-rules default %d, --max-config-bytes %d; want 50000, 8 MiB", o.MaxConfigRules, o.MaxConfigBytes)
	}
	for _, f := range []string{"--max-config-rules=-1", "--max-config-bytes=-1"} {
		if _, _, err := serveopts.Parse([]string{f}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), f) {
			t.Fatalf("%s: err %v, want a refusal", f, err)
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	writeTestFile(t, file, usersConfig(3))
	e := newReloadEnv(t, policy.LoadOptions{MaxRules: 2}, file)
	e.waitReloads(t, "failure", 1)
	if p := e.s.svc.Policy(); p != nil {
		t.Fatalf("a config of 3 rules is in force with a limit of 2")
	}
	replaceFile(t, file, usersConfig(2))
	e.waitReloads(t, "success", 1)
	inForce := e.s.svc.Policy()
	replaceFile(t, file, usersConfig(3))
	e.waitReloads(t, "failure", 2)
	if e.s.svc.Policy() != inForce || len(inForce.Rules()) != 2 {
		t.Errorf("a too-large config replaced the config in force")
	}
	if logs := strings.Join(e.logs.infoAndAbove(), "\n"); strings.Count(logs, "ERROR config rejected") != 2 {
		t.Errorf("want 2 \"config rejected\" errors in:\n%s", logs)
	}
}
