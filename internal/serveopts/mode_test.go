package serveopts

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
)

// TestModeDetection: under --mode=auto the reference's own variables or
// binary name select reference mode, generic names do not, --config and
// its twin outrank them, and --mode forces either; the startup line says
// why.
func TestModeDetection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		asRef  bool
		args   []string
		env    []string
		ref    bool
		reason string // substring of the logged reason
	}{
		{"nothing set", false, nil, nil, false, "no envoyproxy/ratelimit variable"},
		{"generic names do not switch", false, nil, []string{"PORT", "8080", "GRPC_PORT", "8081", "LOG_LEVEL", "debug", "HOST", "0.0.0.0"}, false, "no envoyproxy/ratelimit variable"},
		{"runtime root", false, nil, []string{"RUNTIME_ROOT", "/data"}, true, "RUNTIME_ROOT"},
		{"istio sample", false, nil, []string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis:6379", "USE_STATSD", "false", "RUNTIME_ROOT", "/data", "RUNTIME_SUBDIRECTORY", "ratelimit"}, true, "REDIS_URL"},
		{"headers variable", false, nil, []string{"LIMIT_RESPONSE_HEADERS_ENABLED", "false"}, true, "LIMIT_RESPONSE_HEADERS_ENABLED"},
		{"own config twin outranks", false, nil, []string{"RATELIMITD_CONFIG", "/etc/x", "RUNTIME_ROOT", "/data"}, false, "outranks RUNTIME_ROOT"},
		{"own config flag outranks", false, []string{"--config=/etc/x"}, []string{"REDIS_URL", "r:6379"}, false, "--config"},
		{"own config source outranks", false, []string{"--config-source=file"}, []string{"REDIS_URL", "r:6379"}, false, "--config-source"},
		{"binary name", true, nil, nil, true, "invoked as ratelimit"},
		{"binary name, own config", true, []string{"--config=/etc/x"}, nil, false, "--config"},
		{"forced native", false, []string{"--mode=native"}, []string{"RUNTIME_ROOT", "/data"}, false, "--mode=native"},
		{"forced reference by twin", false, nil, []string{"RATELIMITD_MODE", "reference", "RATELIMITD_CONFIG", "/etc/x"}, true, "RATELIMITD_MODE=reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _, err := ParseAs(tc.asRef, tc.args, env(tc.env...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			msg, attrs := o.ModeLog()
			if o.Reference != tc.ref {
				t.Errorf("reference mode %v, want %v (%s %v)", o.Reference, tc.ref, msg, attrs)
			}
			if !strings.Contains(o.modeReason, tc.reason) {
				t.Errorf("reason %q does not say %q", o.modeReason, tc.reason)
			}
			wantMode := "native"
			if tc.ref {
				wantMode = "reference"
			}
			if attrs[0] != "mode" || attrs[1] != wantMode || attrs[2] != "reason" || attrs[3] != o.modeReason {
				t.Errorf("log attributes %v", attrs)
			}
		})
	}
	if _, _, err := Parse([]string{"--mode=compat"}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), "--mode") {
		t.Errorf("--mode=compat: %v, want an error naming --mode", err)
	}
}

// TestReferenceModeDefaults: what reference mode changes, and that a
// ratelimitd flag or twin still wins over each of its defaults.
func TestReferenceModeDefaults(t *testing.T) {
	type view struct {
		Headers, Limit, Remaining, Reset   string
		Counting                           string
		ProblemBody, Requests, RefCounting bool
		StopIncrement                      bool
		Config                             []string
		Backend, RedisURL                  string
	}
	get := func(t *testing.T, args []string, kv ...string) view {
		t.Helper()
		o, _, err := Parse(args, env(kv...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		return view{o.Headers, o.LegacyLimitHeader, o.LegacyRemainingHeader, o.LegacyResetHeader, o.Counting,
			o.ProblemBody, o.ReferenceAnswers, o.ReferenceCounting, o.StopIncrementWhenOverLimit, o.Config, o.Backend, o.Redis.URL}
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want view
	}{
		{"native defaults", nil, nil, view{"ietf", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "all_or_nothing", true, false, false, false, []string{"./config"}, "memory", "redis://127.0.0.1:6379/0"}},
		{"reference, nothing else", nil, []string{"USE_STATSD", "false"},
			view{"none", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "always_charge", false, true, true, false, []string{"/srv/runtime_data/current/config"}, "redis", "unix:///var/run/nutcracker/ratelimit.sock"}},
		{"reference headers off", nil, []string{"RUNTIME_ROOT", "/d", "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "r:6379", "LIMIT_RESPONSE_HEADERS_ENABLED", "false"},
			view{"none", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "always_charge", false, true, true, false, []string{"/d/config"}, "redis", "redis://r:6379"}},
		{"reference headers on, one name set", nil, []string{"RUNTIME_ROOT", "/d", "LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_REMAINING_HEADER", "X-Left", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true", "BACKEND_TYPE", "redis", "REDIS_URL", "redis://r:1/0"},
			view{"legacy", "RateLimit-Limit", "X-Left", "RateLimit-Reset", "all_or_nothing", false, true, true, true, []string{"/d/config"}, "redis", "redis://r:1/0"}},
		{"reference, own flags win", []string{"--headers=ietf", "--problem-body", "--backend=memory", "--legacy-reset-header=Reset-In", "--counting=all_or_nothing"}, []string{"RUNTIME_ROOT", "/d"},
			view{"ietf", "RateLimit-Limit", "RateLimit-Remaining", "Reset-In", "all_or_nothing", true, true, true, false, []string{"/d/config"}, "memory", "redis://127.0.0.1:6379/0"}},
		{"native with the reference's header variables", nil, []string{"RATELIMITD_CONFIG", "/etc/x", "LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_LIMIT_HEADER", "Quota"},
			view{"legacy", "Quota", "X-RateLimit-Remaining", "X-RateLimit-Reset", "all_or_nothing", true, false, false, false, []string{"/etc/x"}, "memory", "redis://127.0.0.1:6379/0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, get(t, tc.args, tc.env...)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, _, err := Parse([]string{"--legacy-limit-header=Bad Name"}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), "--legacy-limit-header") {
		t.Errorf("a header name with a space: %v, want an error", err)
	}
}

// TestReferenceModeStatsd: STATSD_HOST without USE_STATSD: native mode
// warns (nothing is sent), reference mode sends there as the reference
// does, without a warning.
func TestReferenceModeStatsd(t *testing.T) {
	o, warnings, err := Parse(nil, env("STATSD_HOST", "sink", "TRACING_SERVICE_NAMESPACE", "ns"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Reference || o.StatsdAddr != "" || len(warnings) != 1 || !strings.Contains(warnings[0], "STATSD_HOST") {
		t.Errorf("native: reference %v, statsd %q, warnings %q", o.Reference, o.StatsdAddr, warnings)
	}
	o, warnings, err = Parse(nil, env("RUNTIME_ROOT", "/d", "STATSD_HOST", "sink", "TRACING_SERVICE_NAMESPACE", "ns"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Reference || o.StatsdAddr != "sink:8125" || len(warnings) != 1 || strings.Contains(warnings[0], "STATSD_HOST") || !strings.Contains(warnings[0], "TRACING_SERVICE_NAMESPACE") {
		t.Errorf("reference: statsd %q, warnings %q", o.StatsdAddr, warnings)
	}
	o, warnings, err = Parse(nil, env("RUNTIME_ROOT", "/d", "USE_STATSD", "false", "STATSD_HOST", "sink"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.StatsdAddr != "" || len(warnings) != 0 {
		t.Errorf("reference, USE_STATSD=false: statsd %q, warnings %q", o.StatsdAddr, warnings)
	}
}

// TestReferenceModeMemcacheTimeout: reference mode defaults
// --memcache-timeout to gomemcache's 500ms (the reference's memcache
// client's); native mode and an explicit setting keep theirs.
func TestReferenceModeMemcacheTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want time.Duration
	}{
		{"native", nil, nil, memcache.DefaultTimeout},
		{"reference", nil, []string{"RUNTIME_ROOT", "/d", "BACKEND_TYPE", "memcache", "MEMCACHE_HOST_PORT", "m:11211"}, 500 * time.Millisecond},
		{"reference, flag", []string{"--memcache-timeout=80ms"}, []string{"RUNTIME_ROOT", "/d"}, 80 * time.Millisecond},
		{"reference, twin", nil, []string{"RUNTIME_ROOT", "/d", "RATELIMITD_MEMCACHE_TIMEOUT", "2s"}, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _, err := Parse(tc.args, env(tc.env...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if o.Memcache.Timeout != tc.want {
				t.Errorf("memcache timeout %s, want %s", o.Memcache.Timeout, tc.want)
			}
		})
	}
}

// TestStatsdTagsOption: EXTRA_TAGS maps to --statsd-tags, parsed as the
// reference parses it; RATELIMITD_STATSD_TAGS wins; a malformed item is an
// error.
func TestStatsdTagsOption(t *testing.T) {
	o, warnings, err := Parse(nil, env("USE_STATSD", "true", "EXTRA_TAGS", "a:b,foo:bar"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warnings {
		if strings.Contains(w, "EXTRA_TAGS") {
			t.Errorf("EXTRA_TAGS named unsupported: %q", w)
		}
	}
	tags, err := ParseStatsdTags(o.StatsdTags)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"a": "b", "foo": "bar"}, tags); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
	o, _, err = Parse(nil, env("EXTRA_TAGS", "a:b", "RATELIMITD_STATSD_TAGS", "x:y"), io.Discard)
	if err != nil || o.StatsdTags != "x:y" {
		t.Errorf("twin: %q, %v; want x:y", o.StatsdTags, err)
	}
	for _, bad := range []string{"a", "a:b:c", "a:b,"} {
		if _, _, err := Parse([]string{"--statsd-tags=" + bad}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), "--statsd-tags") {
			t.Errorf("--statsd-tags=%q: %v, want an error naming --statsd-tags", bad, err)
		}
	}
	if tags, err := ParseStatsdTags(" "); err != nil || tags != nil {
		t.Errorf("blank: %v, %v", tags, err)
	}
}
