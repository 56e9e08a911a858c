package serveopts

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// TestRedisTuningFlagsReachOptions: every Redis tuning flag, and its
// RATELIMITD_* twin, reaches redis.Options.
func TestRedisTuningFlagsReachOptions(t *testing.T) {
	d, _, err := Parse(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	def := redis.DefaultOptions()
	def.Pipelines = redis.DefaultPipelines // 0 in DefaultOptions means the same
	if diff := cmp.Diff(def, redisOptions(d), cmp.Comparer(func(a, b func() time.Time) bool { return a == nil && b == nil })); diff != "" {
		t.Errorf("defaults differ from redis.DefaultOptions (-redis +flags):\n%s", diff)
	}
	set := map[string]string{
		"redis-pool-size":             "8",
		"redis-dial-timeout":          "400ms",
		"redis-min-idle-conns":        "3",
		"redis-pipelines":             "6",
		"redis-health-interval":       "250ms",
		"redis-breaker-failures":      "9",
		"redis-breaker-fail-for":      "70ms",
		"redis-breaker-window":        "2s",
		"redis-breaker-min-calls":     "40",
		"redis-breaker-failure-ratio": "0.25",
		"redis-breaker-open-for":      "600ms",
		"redis-breaker-probes":        "5",
		"redis-max-wait":              "300ms",
		"redis-deadline-margin":       "3ms",
	}
	want := redis.DefaultOptions()
	want.PoolSize, want.DialTimeout, want.MinIdleConns, want.Pipelines = 8, 400*time.Millisecond, 3, 6
	want.HealthInterval = 250 * time.Millisecond
	want.MaxWait, want.DeadlineMargin = 300*time.Millisecond, 3*time.Millisecond
	want.Breaker = redis.BreakerOptions{Failures: 9, FailFor: 70 * time.Millisecond, Window: 2 * time.Second,
		MinCalls: 40, FailureRatio: 0.25, OpenFor: 600 * time.Millisecond, Probes: 5}
	var args, twins []string
	for f, v := range set {
		args = append(args, "--"+f+"="+v)
		twins = append(twins, envName(f), v)
	}
	viaFlags, _, err := Parse(args, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	viaTwins, _, err := Parse(nil, env(twins...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Options{"flags": viaFlags, "twins": viaTwins} {
		got := redisOptions(o)
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b func() time.Time) bool { return a == nil && b == nil })); diff != "" {
			t.Errorf("%s: redis.Options (-want +got):\n%s", name, diff)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A flag beats its twin.
	o, _, err := Parse([]string{"--redis-breaker-probes=2"}, env("RATELIMITD_REDIS_BREAKER_PROBES", "7"), io.Discard)
	if err != nil || redisOptions(o).Breaker.Probes != 2 {
		t.Errorf("flag vs twin: probes %d, %v", redisOptions(o).Breaker.Probes, err)
	}
}

// TestRedisTuningFlagSemantics: the Redis tuning flags' special values
// (breaker off, zero, pool caps, TLS implied by a CA) reach redis.Options
// with their documented meaning.
func TestRedisTuningFlagSemantics(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		env  []string
		get  func(redis.Options) any
		want any
	}{
		{"breaker off", []string{"--redis-breaker=false"}, nil, func(r redis.Options) any { return r.Breaker.Disabled }, true},
		{"breaker off twin", nil, []string{"RATELIMITD_REDIS_BREAKER", "false"}, func(r redis.Options) any { return r.Breaker.Disabled }, true},
		// The store ignores the breaker's settings when it is off, and so
		// does validation.
		{"breaker off ignores its settings", []string{"--redis-breaker=false", "--redis-breaker-failures=0"}, nil, func(r redis.Options) any { return r.Breaker.Failures }, 0},
		{"min idle capped at pool", []string{"--redis-pool-size=1"}, nil, func(r redis.Options) any { return r.MinIdleConns }, 1},
		{"min idle above pool capped", []string{"--redis-pool-size=4", "--redis-min-idle-conns=10"}, nil, func(r redis.Options) any { return r.MinIdleConns }, 4},
		{"min idle zero", []string{"--redis-min-idle-conns=0"}, nil, func(r redis.Options) any { return r.MinIdleConns }, 0},
		{"health probe off", []string{"--redis-health-interval=0"}, nil, func(r redis.Options) any { return r.HealthInterval }, time.Duration(0)},
		{"pipelines store default", []string{"--redis-pipelines=0"}, nil, func(r redis.Options) any { return r.Pipelines }, 0},
		{"probes zero", []string{"--redis-breaker-probes=0"}, nil, func(r redis.Options) any { return r.Breaker.Probes }, 0},
		{"fail-for zero", []string{"--redis-breaker-fail-for=0s"}, nil, func(r redis.Options) any { return r.Breaker.FailFor }, time.Duration(0)},
		{"sentinel auth", []string{"--redis-sentinel-auth=u:p"}, nil, func(r redis.Options) any { return r.SentinelUsername + " " + r.SentinelPassword }, "u p"},
		{"tls from ca", []string{"--redis-tls-ca=ca.pem"}, nil, func(r redis.Options) any { return r.TLS }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, _, err := Parse(c.args, env(c.env...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			ro := redisOptions(o)
			if diff := cmp.Diff(c.want, c.get(ro)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if !strings.Contains(c.name, "tls") {
				if err := ro.Validate(); err != nil {
					t.Errorf("redis.Options.Validate: %v", err)
				}
			}
		})
	}
}

// TestRedisTuningFlagErrors: a bad tuning value fails Parse with an error
// naming the flag (or the twin), and redis.Options.Validate rejects it too:
// the command's ranges are the store's.
func TestRedisTuningFlagErrors(t *testing.T) {
	for _, c := range []struct{ flag, val string }{
		{"redis-dial-timeout", "0s"},
		{"redis-dial-timeout", "-1s"},
		{"redis-min-idle-conns", "-1"},
		{"redis-pipelines", "-2"},
		{"redis-health-interval", "-1s"},
		{"redis-breaker-failures", "0"},
		{"redis-breaker-fail-for", "-1ms"},
		{"redis-breaker-window", "5ms"},
		{"redis-breaker-min-calls", "0"},
		{"redis-breaker-failure-ratio", "0"},
		{"redis-breaker-failure-ratio", "1.5"},
		{"redis-breaker-open-for", "0s"},
		{"redis-breaker-probes", "-1"},
	} {
		o, _, err := Parse([]string{"--" + c.flag + "=" + c.val}, env(), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--"+c.flag+"=") {
			t.Errorf("--%s=%s: error %v does not name the flag", c.flag, c.val, err)
		}
		if err := redisOptions(o).Validate(); err == nil {
			t.Errorf("--%s=%s: accepted by redis.Options.Validate, rejected by the command", c.flag, c.val)
		}
		_, _, err = Parse(nil, env(envName(c.flag), c.val), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--"+c.flag+"=") {
			t.Errorf("%s=%s: error %v", envName(c.flag), c.val, err)
		}
	}
	// Unparsable values name the twin.
	if _, _, err := Parse(nil, env("RATELIMITD_REDIS_BREAKER_WINDOW", "soon"), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "RATELIMITD_REDIS_BREAKER_WINDOW") {
		t.Errorf("bad twin: %v", err)
	}
	// Several at once.
	_, _, err := Parse([]string{"--redis-pipelines=-1", "--redis-breaker-probes=-1"}, env(), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--redis-pipelines") || !strings.Contains(err.Error(), "--redis-breaker-probes") {
		t.Errorf("joined errors: %v", err)
	}
}

// TestBackendTargetSentinel: in Sentinel mode the backend log line names
// the master and the sentinels, not a URL pointing at the first sentinel,
// and never the password.
func TestBackendTargetSentinel(t *testing.T) {
	o, _, err := Parse(nil, env("BACKEND_TYPE", "redis", "REDIS_TYPE", "sentinel", "REDIS_URL", "mymaster,127.0.0.1:26379,127.0.0.1:26380", "REDIS_AUTH", "s3cretpw"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]any{}
	kv := BackendTarget(o)
	for i := 0; i+1 < len(kv); i += 2 {
		attrs[kv[i].(string)] = kv[i+1]
	}
	if attrs["master"] != "mymaster" || attrs["sentinels"] != "127.0.0.1:26379,127.0.0.1:26380" {
		t.Errorf("attrs %v: want master=mymaster sentinels=127.0.0.1:26379,127.0.0.1:26380", attrs)
	}
	if _, ok := attrs["url"]; ok {
		t.Errorf("attrs %v: a url in Sentinel mode", attrs)
	}
	if s := fmt.Sprint(kv); strings.Contains(s, "s3cretpw") || strings.Contains(s, "xxxxx") {
		t.Errorf("attrs %s: a password or its mask", s)
	}
}
