package serveopts

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// TestServiceOptionFlags: the service options exposed as flags: defaults,
// flags and twins.
func TestServiceOptionFlags(t *testing.T) {
	d, _, err := Parse(nil, env(), io.Discard)
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
	o, _, err := Parse(args, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Service.NearLimitHeader || o.Service.ProblemTypeBase != "https://errors.example/" || o.Service.ProblemDetail != "{policy} is over" ||
		o.Service.DetailedMetricCap != -1 || o.Service.FailClosedRetryAfter != 5*time.Second || o.MemoryMaxKeys != 0 || o.Counting != "always_charge" {
		t.Errorf("flags: %+v", o)
	}
	e, _, err := Parse(nil, env("RATELIMITD_NEAR_LIMIT_HEADER", "true", "RATELIMITD_PROBLEM_TYPE_BASE", "https://errors.example/",
		"RATELIMITD_PROBLEM_DETAIL", "{policy} is over", "RATELIMITD_DETAILED_METRIC_CAP", "-1",
		"RATELIMITD_FAIL_CLOSED_RETRY_AFTER", "5s", "RATELIMITD_MEMORY_MAX_KEYS", "0", "RATELIMITD_COUNTING", "always_charge"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(o, e, ignoreFromEnv); diff != "" {
		t.Errorf("twins differ from flags (-flags +twins):\n%s", diff)
	}
	for _, bad := range [][]string{{"--fail-closed-retry-after=0s"}, {"--detailed-metric-cap=0"}, {"--memory-max-keys=-1"}} {
		if _, _, err := Parse(bad, env(), io.Discard); err == nil || !strings.Contains(err.Error(), strings.SplitN(bad[0], "=", 2)[0]) {
			t.Errorf("%v: err %v", bad, err)
		}
	}
}

// TestLogLevelCaseInsensitive: log levels and formats are case-insensitive,
// from flags and twins.
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
		o, _, err := Parse(c.args, env(c.env...), io.Discard)
		if err != nil {
			t.Fatalf("%v %v: %v", c.args, c.env, err)
		}
		if o.LogLevel != c.want {
			t.Errorf("%v %v: level %q, want %q", c.args, c.env, o.LogLevel, c.want)
		}
	}
	o, _, err := Parse(nil, env("RATELIMITD_LOG_FORMAT", "JSON"), io.Discard)
	if err != nil || o.LogFormat != "json" {
		t.Errorf("format %q, %v", o.LogFormat, err)
	}
	if _, _, err := Parse([]string{"--log-level=LOUD"}, env(), io.Discard); err == nil {
		t.Error("unknown level accepted")
	}
}

// TestUnknownTwins: UnknownTwins names, sorted, the RATELIMITD_* variables
// that are no flag's twin, and no known one.
func TestUnknownTwins(t *testing.T) {
	w := UnknownTwins([]string{"PATH=/bin", "RATELIMITD_REDIS_ULR=redis://x", "RATELIMITD_REDIS_URL=redis://y",
		"RATELIMITD_REQUIRE_REDIS=1", "RATELIMITD_LOGLEVEL=debug", "RATELIMITD_MEMORY_MAX_KEYS=5"})
	if !strings.Contains(w, "RATELIMITD_LOGLEVEL, RATELIMITD_REDIS_ULR") {
		t.Errorf("warning %q does not name the two unknown variables (sorted)", w)
	}
	for _, known := range []string{"RATELIMITD_REDIS_URL", "RATELIMITD_REQUIRE_REDIS", "RATELIMITD_MEMORY_MAX_KEYS", "PATH"} {
		if strings.Contains(w, known+",") || strings.HasSuffix(w, known) {
			t.Errorf("warning %q names %s", w, known)
		}
	}
	if w := UnknownTwins([]string{"RATELIMITD_CONFIG=/x", "HOME=/root"}); w != "" {
		t.Errorf("no unknown variable, warning %q", w)
	}
}

// TestRetryJitterZeroDisables: a zero retry jitter turns jitter off (-1 to
// the service); any other value passes as is.
func TestRetryJitterZeroDisables(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{0: -1, time.Second: time.Second, 250 * time.Millisecond: 250 * time.Millisecond} {
		if got := retryJitter(in); got != want {
			t.Errorf("retryJitter(%v) = %v, want %v", in, got, want)
		}
	}
}

// The memcache Store says it decides no penalty box, which serve passes
// to the config loader (service.PenaltyBoxer).
var _ service.PenaltyBoxer = (*memcache.Store)(nil)
