package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/health"

	"github.com/ratelimitd/ratelimitd/internal/events"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// seriesValue returns the value of the first series of name whose labels
// include want (0, false when none).
func seriesValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue next
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// TestBuildInfo: ratelimitd_build_info carries the linker-set version and
// commit and the Go version.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := events.New(slog.New(slog.DiscardHandler), "memory").Register(reg, version, commit); err != nil {
		t.Fatal(err)
	}
	v, ok := seriesValue(t, reg, "ratelimitd_build_info", map[string]string{"version": version, "commit": commit, "goversion": runtime.Version()})
	if !ok || v != 1 {
		t.Errorf("build_info = %v (found %v), want 1", v, ok)
	}
}

// TestCircuitTransitionEvents: the Redis circuit breaker's transitions
// reach the log and ratelimitd_backend_circuit_transitions_total{to}:
// opened when Redis dies, half-open and closed when it is back.
func TestCircuitTransitionEvents(t *testing.T) {
	srv := redistest.Standalone(t)
	logs := &testproc.Buffer{}
	ev := events.New(slog.New(slog.NewJSONHandler(logs, nil)), "redis")
	reg := prometheus.NewRegistry()
	if err := ev.Register(reg, version, commit); err != nil {
		t.Fatal(err)
	}
	o := serveopts.Defaults()
	o.Backend, o.Redis.URL, o.Redis.Timeout = "redis", srv.URL(), time.Second
	// The breaker and the health probe on a clock the test moves: each
	// Tick is one run of the probe, with the time at its deadline.
	clk := clock.NewManual()
	o.Redis.Clock = clk
	store, _, closeStore, err := serveopts.NewStore(o, ev)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeStore() }()
	hit := []algo.Hit{{Key: "events", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}, Cost: 1}}
	take := func() error { _, err := algotest.Take(context.Background(), store, hit); return err }
	if err := take(); err != nil {
		t.Fatal(err)
	}
	count := func(to string) float64 {
		v, _ := seriesValue(t, reg, "ratelimitd_backend_circuit_transitions_total", map[string]string{"to": to})
		return v
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for i := 0; !cond(); i++ {
			if i == 200 {
				t.Fatalf("%s: not within %d runs of the health probe; transitions open=%v half_open=%v closed=%v\n%s", what, i, count("open"), count("half_open"), count("closed"), logs.String())
			}
			_ = take()
			clk.Tick(t)
		}
	}
	if n := count("open") + count("closed") + count("half_open"); n != 0 {
		t.Fatalf("%v transitions while Redis answers", n)
	}
	srv.Kill()
	// Several failed half-open probes: each opens the circuit again.
	until("circuit opened 4 times", func() bool { return count("open") >= 4 })
	srv.Start()
	until("circuit closed", func() bool { return count("closed") >= 1 })
	if err := take(); err != nil {
		t.Errorf("take after the circuit closed: %v", err)
	}
	if count("half_open") < 1 {
		t.Errorf("closed without half_open")
	}
	// One line when it opened and one when it closed, with the failed
	// probes, not one per transition (the metric counts those).
	l := logs.String()
	for _, msg := range []string{"backend circuit opened", "backend circuit closed"} {
		if n := strings.Count(l, msg); n != 1 {
			t.Errorf("%d %q lines for %v openings, want 1:\n%s", n, msg, count("open"), l)
		}
	}
	if strings.Contains(l, "half-open") || strings.Contains(l, "still open") {
		t.Errorf("a line per probe or a still-open line within %v:\n%s", redis.DefaultBreakerReportEvery, l)
	}
	for _, line := range strings.Split(l, "\n") {
		if !strings.Contains(line, "backend circuit closed") {
			continue
		}
		var rec struct {
			FailedProbes float64 `json:"failed_probes"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if want := count("open") - 1; rec.FailedProbes != want {
			t.Errorf("closed line: failed_probes %v, want %v (every opening after the first)", rec.FailedProbes, want)
		}
	}
}

// TestConfigAppliedAndRejectedEvents: a config put in force is logged with
// its hash and source hash; a rejected reload is logged and counted, the
// config in force stays.
func TestConfigAppliedAndRejectedEvents(t *testing.T) {
	mem := memoryStore(t)
	reg := prometheus.NewRegistry()
	svc := newTestService(t, service.Options{Store: mem, Registerer: reg})
	logs := &testproc.Buffer{}
	s := &server{log: slog.New(slog.NewJSONHandler(logs, nil)), svc: svc, store: mem, health: health.NewServer()}
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	set, warns, err := policy.Load(policy.LoadOptions{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	s.apply(set, warns)
	if l := logs.String(); !strings.Contains(l, `"msg":"config loaded"`) || !strings.Contains(l, `"source_hash":"`+set.SourceHash()+`"`) ||
		!strings.Contains(l, `"hash":"`+set.Hash()+`"`) {
		t.Errorf("config loaded line lacks the hashes:\n%s", l)
	}
	s.fail(errors.New("a.yaml:3: bad unit"))
	if l := logs.String(); !strings.Contains(l, `"msg":"config rejected; keeping the last good config"`) || !strings.Contains(l, "bad unit") {
		t.Errorf("no rejection line:\n%s", l)
	}
	if v, _ := seriesValue(t, reg, "ratelimitd_config_reloads_total", map[string]string{"result": "failure"}); v != 1 {
		t.Errorf("reloads_total{failure} = %v, want 1", v)
	}
	if svc.Policy() != set {
		t.Error("the rejected reload replaced the config in force")
	}
}
