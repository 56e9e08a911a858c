package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The service options exposed as flags: defaults, flags and twins.
func TestServiceOptionFlags(t *testing.T) {
	d, _, err := parseServe(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.Service.NearLimitHeader || d.Service.ProblemTypeBase != service.DefaultProblemTypeBase || d.Service.ProblemDetail != "" ||
		d.Service.DetailedMetricCap != service.DefaultDetailedMetricCap || d.Service.FailClosedRetryAfter != service.DefaultFailClosedRetryAfter ||
		d.MemoryMaxKeys != 1_000_000 || d.Counting != "all_or_nothing" {
		t.Errorf("defaults: %+v", d)
	}
	args := []string{"--near-limit-header", "--problem-type-base=https://errors.example/", "--problem-detail={policy} is over",
		"--detailed-metric-cap=-1", "--fail-closed-retry-after=5s", "--memory-max-keys=0", "--counting=always_charge"}
	o, _, err := parseServe(args, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Service.NearLimitHeader || o.Service.ProblemTypeBase != "https://errors.example/" || o.Service.ProblemDetail != "{policy} is over" ||
		o.Service.DetailedMetricCap != -1 || o.Service.FailClosedRetryAfter != 5*time.Second || o.MemoryMaxKeys != 0 || o.Counting != "always_charge" {
		t.Errorf("flags: %+v", o)
	}
	e, _, err := parseServe(nil, env("RATELIMITD_NEAR_LIMIT_HEADER", "true", "RATELIMITD_PROBLEM_TYPE_BASE", "https://errors.example/",
		"RATELIMITD_PROBLEM_DETAIL", "{policy} is over", "RATELIMITD_DETAILED_METRIC_CAP", "-1",
		"RATELIMITD_FAIL_CLOSED_RETRY_AFTER", "5s", "RATELIMITD_MEMORY_MAX_KEYS", "0", "RATELIMITD_COUNTING", "always_charge"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(o, e, ignoreFromEnv); diff != "" {
		t.Errorf("twins differ from flags (-flags +twins):\n%s", diff)
	}
	for _, bad := range [][]string{{"--fail-closed-retry-after=0s"}, {"--detailed-metric-cap=0"}, {"--memory-max-keys=-1"}} {
		if _, _, err := parseServe(bad, env(), io.Discard); err == nil || !strings.Contains(err.Error(), strings.SplitN(bad[0], "=", 2)[0]) {
			t.Errorf("%v: err %v", bad, err)
		}
	}
}

// Log levels and formats are case-insensitive, from flags and twins.
func TestLogLevelCaseInsensitive(t *testing.T) {
	for _, c := range []struct {
		args, env []string
		want      string
	}{
		{nil, []string{"RATELIMITD_LOG_LEVEL", "DEBUG"}, "debug"},
		{[]string{"--log-level=Warn"}, nil, "warn"},
		{nil, []string{"RATELIMITD_LOG_LEVEL", "WARNING"}, "warn"},
		{[]string{"--log-level", " ERROR "}, nil, "error"},
	} {
		o, _, err := parseServe(c.args, env(c.env...), io.Discard)
		if err != nil {
			t.Fatalf("%v %v: %v", c.args, c.env, err)
		}
		if o.LogLevel != c.want {
			t.Errorf("%v %v: level %q, want %q", c.args, c.env, o.LogLevel, c.want)
		}
	}
	o, _, err := parseServe(nil, env("RATELIMITD_LOG_FORMAT", "JSON"), io.Discard)
	if err != nil || o.LogFormat != "json" {
		t.Errorf("format %q, %v", o.LogFormat, err)
	}
	if _, _, err := parseServe([]string{"--log-level=LOUD"}, env(), io.Discard); err == nil {
		t.Error("unknown level accepted")
	}
}

func TestUnknownTwins(t *testing.T) {
	w := unknownTwins([]string{"PATH=/bin", "RATELIMITD_REDIS_ULR=redis://x", "RATELIMITD_REDIS_URL=redis://y",
		"RATELIMITD_REQUIRE_REDIS=1", "RATELIMITD_LOGLEVEL=debug", "RATELIMITD_MEMORY_MAX_KEYS=5"})
	if !strings.Contains(w, "RATELIMITD_LOGLEVEL, RATELIMITD_REDIS_ULR") {
		t.Errorf("warning %q does not name the two unknown variables (sorted)", w)
	}
	for _, known := range []string{"RATELIMITD_REDIS_URL", "RATELIMITD_REQUIRE_REDIS", "RATELIMITD_MEMORY_MAX_KEYS", "PATH"} {
		if strings.Contains(w, known+",") || strings.HasSuffix(w, known) {
			t.Errorf("warning %q names %s", w, known)
		}
	}
	if w := unknownTwins([]string{"RATELIMITD_CONFIG=/x", "HOME=/root"}); w != "" {
		t.Errorf("no unknown variable, warning %q", w)
	}
}

// A bad flag value is printed once, with a short hint, not the whole usage.
func TestServeFlagErrorOnce(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"serve", "--shutdown-grace", "abc"}, env(), &out, &errb)
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	got := errb.String()
	if n := strings.Count(got, `--shutdown-grace=abc: not a duration`); n != 1 {
		t.Errorf("error printed %d times:\n%s", n, got)
	}
	if strings.Contains(got, "-redis-url") || !strings.Contains(got, "ratelimitd serve -h") {
		t.Errorf("want a short hint, not the usage:\n%s", got)
	}
	errb.Reset()
	if code := run(context.Background(), []string{"serve", "-h"}, env(), &out, &errb); code != 0 || !strings.Contains(errb.String(), "-memory-max-keys") {
		t.Errorf("-h: exit %d, usage:\n%s", code, errb.String())
	}
}

func TestValidateEmptyConfig(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "notes.txt"), "x")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"validate", dir}, env(), &out, &errb); code != 0 {
		t.Errorf("validate: exit %d, want 0\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "warning: no rate-limit domains loaded from "+dir) {
		t.Errorf("no warning:\n%s", out.String())
	}
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"validate", "--strict", dir}, env(), &out, &errb); code != 1 {
		t.Errorf("validate --strict: exit %d, want 1\n%s%s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"validate", "--nope", dir}, env(), &out, &errb); code != 2 ||
		strings.Count(errb.String(), "-nope") != 1 || strings.Contains(errb.String(), "-merge-domains") {
		t.Errorf("bad flag: exit %d\n%s", code, errb.String())
	}
}

func TestRetryJitterZeroDisables(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{0: -1, time.Second: time.Second, 250 * time.Millisecond: 250 * time.Millisecond} {
		if got := retryJitter(in); got != want {
			t.Errorf("retryJitter(%v) = %v, want %v", in, got, want)
		}
	}
}

// validate --backend=memcache (or BACKEND_TYPE=memcache) refuses the
// algorithms memcached cannot decide, as serve would.
func TestValidateBackendAlgorithms(t *testing.T) {
	dir := t.TempDir()
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window}\n"
	writeTestFile(t, filepath.Join(dir, "d.yaml"), cfg)
	for _, c := range []struct {
		args []string
		env  []string
		code int
	}{
		{[]string{"validate", dir}, nil, 0},
		{[]string{"validate", "--backend=redis", dir}, nil, 0},
		{[]string{"validate", "--backend=memcache", dir}, nil, 1},
		{[]string{"validate", dir}, []string{"BACKEND_TYPE", "memcache"}, 1},
		{[]string{"validate", dir}, []string{"RATELIMITD_BACKEND", "memcached"}, 1},
		{[]string{"validate", "--backend=etcd", dir}, nil, 2},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, env(c.env...), &out, &errb)
		if code != c.code {
			t.Errorf("%v %v: exit %d, want %d\n%s%s", c.args, c.env, code, c.code, out.String(), errb.String())
		}
		if c.code == 1 && !strings.Contains(out.String(), "d.yaml:4: descriptor \"d.k\": algorithm sliding_window is not supported by the memcache backend") {
			t.Errorf("%v %v: output lacks the refusal:\n%s", c.args, c.env, out.String())
		}
	}
}

// validate --backend=memcache refuses a penalty box, which memcached
// cannot decide atomically, at its line; the other backends load it.
func TestValidateBackendPenalty(t *testing.T) {
	dir := t.TempDir()
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    penalty: {after: 3, within: 1h, block: 5m}\n"
	writeTestFile(t, filepath.Join(dir, "d.yaml"), cfg)
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"validate", dir}, 0},
		{[]string{"validate", "--backend=redis", dir}, 0},
		{[]string{"validate", "--backend=memcache", dir}, 1},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, env(), &out, &errb)
		if code != c.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", c.args, code, c.code, out.String(), errb.String())
		}
		if c.code == 1 && !strings.Contains(out.String(), `d.yaml:5: descriptor "d.k": penalty is not supported by the memcache backend`) {
			t.Errorf("%v: output lacks the refusal:\n%s", c.args, out.String())
		}
	}
}

// The memcache Store says it decides no penalty box, which serve passes
// to the config loader (service.PenaltyBoxer).
var _ service.PenaltyBoxer = (*memcache.Store)(nil)

// configMapDir lays out files as the kubelet mounts a ConfigMap volume:
// ..<timestamp>/ holding the files, ..data -> ..<timestamp>, and a
// symlink <name> -> ..data/<name> per file.
func configMapDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := "..2026_12_01_00_00_00.000000001"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		writeTestFile(t, filepath.Join(dir, ts, name), content)
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// validate and serve read --ignore-dotfiles alike (same default, flag,
// twin and envoyproxy/ratelimit variable): validate accepts the
// ConfigMap-shaped directory serve loads, and where both are told not to
// skip dot entries validate's error names the dot directory.
func TestValidateConfigMapDir(t *testing.T) {
	dir := configMapDir(t, map[string]string{
		"example.yaml": "domain: example\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	})
	for _, c := range []struct {
		name string
		args []string
		env  []string
	}{
		{"defaults", nil, nil},
		{"flag off", []string{"--ignore-dotfiles=false"}, nil},
		{"flag on", []string{"--ignore-dotfiles"}, []string{"RATELIMITD_IGNORE_DOTFILES", "false"}},
		{"twin off", nil, []string{"RATELIMITD_IGNORE_DOTFILES", "false"}},
		{"reference off", nil, []string{"RUNTIME_IGNOREDOTFILES", "false"}},
		{"twin wins", nil, []string{"RUNTIME_IGNOREDOTFILES", "false", "RATELIMITD_IGNORE_DOTFILES", "1"}},
		{"reference empty", nil, []string{"RUNTIME_IGNOREDOTFILES", ""}},
	} {
		o, _, err := parseServe(c.args, env(c.env...), io.Discard)
		if err != nil {
			t.Fatalf("%s: serve: %v", c.name, err)
		}
		var out, errb bytes.Buffer
		code := run(context.Background(), append(append([]string{"validate"}, c.args...), dir), env(c.env...), &out, &errb)
		switch {
		case o.IgnoreDotfiles && (code != 0 || !strings.Contains(errb.String(), "ok: 1 domain(s), 1 rule(s)")):
			t.Errorf("%s: serve skips dot entries, validate exit %d:\n%s%s", c.name, code, out.String(), errb.String())
		case !o.IgnoreDotfiles && (code != 1 || !strings.Contains(out.String(), "set the ignore-dotfiles option") || strings.Contains(out.String(), "merge-domains")):
			t.Errorf("%s: serve loads dot entries, validate exit %d:\n%s%s", c.name, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"validate", dir}, env("RUNTIME_IGNOREDOTFILES", "maybe"), &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), `RUNTIME_IGNOREDOTFILES="maybe"`) {
		t.Errorf("malformed variable: exit %d\n%s", code, errb.String())
	}
}

// TestValidateConfigSizeBounds: validate refuses what serve refuses for
// size (--max-config-rules, --max-config-bytes and their twins, with
// serve's defaults), so a CI gate on validate never passes a config whose
// pod would never become ready.
func TestValidateConfigSizeBounds(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 12 {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: second, requests_per_unit: 5}\n", i)
	}
	writeTestFile(t, filepath.Join(dir, "d.yaml"), b.String())
	for _, c := range []struct {
		args []string
		env  []string
		code int
		want string
	}{
		{[]string{"validate", dir}, nil, 0, ""},
		{[]string{"validate", "--max-config-rules=10", dir}, nil, 1, "config too large"},
		{[]string{"validate", dir}, []string{"RATELIMITD_MAX_CONFIG_RULES", "10"}, 1, "config too large"},
		{[]string{"validate", "--max-config-bytes=100", dir}, nil, 1, "config too large"},
		{[]string{"validate", "--max-config-rules=10", "--max-config-rules=0", dir}, nil, 0, ""},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, env(c.env...), &out, &errb)
		if code != c.code || !strings.Contains(out.String()+errb.String(), c.want) {
			t.Errorf("%v %v: exit %d, want %d with %q\n%s%s", c.args, c.env, code, c.code, c.want, out.String(), errb.String())
		}
	}
	if defaultOptions().MaxConfigRules != 50_000 {
		t.Fatal("the test assumes serve's default of 50000 rules")
	}
}
