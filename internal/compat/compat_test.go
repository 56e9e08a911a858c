package compat

import (
	"errors"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMigratingDocCoversVariables: docs/migrating.md names every
// envoyproxy/ratelimit variable this package reads, ignores or warns about.
func TestMigratingDocCoversVariables(t *testing.T) {
	doc, err := os.ReadFile("../../docs/migrating.md")
	if err != nil {
		t.Fatal(err)
	}
	names := append([]string{}, unsupported...)
	names = append(names, sortedKeys(ignored)...)
	names = append(names, "REDIS_URL", "REDIS_TYPE", "REDIS_AUTH", "REDIS_TLS", "REDIS_POOL_SIZE", "RUNTIME_ROOT",
		"RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "GRPC_PORT", "GRPC_HOST", "PORT", "HOST",
		"DEBUG_PORT", "DEBUG_HOST", "SHADOW_MODE", "LOG_LEVEL", "LOG_FORMAT", "LIMIT_RESPONSE_HEADERS_ENABLED",
		"NEAR_LIMIT_RATIO", "LOCAL_CACHE_SIZE_IN_BYTES", "CACHE_KEY_PREFIX", "BACKEND_TYPE", "MERGE_DOMAIN_CONFIG",
		"QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA", "REDIS_TIMEOUT", "USE_PROMETHEUS", "PROMETHEUS_ADDR",
		"REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "REDIS_SENTINEL_AUTH",
		"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN",
		"USE_STATSD", "STATSD_HOST", "STATSD_PORT", "STATS_FLUSH_INTERVAL", "STATSD_PROTOCOL", "DISABLE_STATS",
		"CONFIG_TYPE", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
		"XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
		"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE")
	for _, n := range names {
		if !strings.Contains(string(doc), "`"+n+"`") {
			t.Errorf("docs/migrating.md does not mention `%s`", n)
		}
	}
}

// sortedKeys is a small helper for deterministic messages.
func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// lookupOf is an environment of name, value pairs.
func lookupOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(n string) (string, bool) { v, ok := m[n]; return v, ok }
}

// defaults are the flag values ReadEnv starts from in these tests.
func defaults(flag string) string {
	return map[string]string{"grpc-addr": ":8081", "http-addr": ":8080", "debug-addr": "127.0.0.1:6070", "xds-tls": "false"}[flag]
}

var plainTable = []Plain{
	{Var: "SHADOW_MODE", Flag: "shadow-mode", Parse: func(v string) (string, error) {
		switch v {
		case "true", "false":
			return v, nil
		}
		return "", errors.New("not a bool")
	}},
	{Var: "CONFIG_GRPC_XDS_SERVER_USE_TLS", Flag: "xds-tls", Parse: func(v string) (string, error) { return v, nil }},
}

// TestReadEnvSets: ReadEnv turns the reference's variables into flag
// assignments, in order, and names the flags an error should blame on a
// variable.
func TestReadEnvSets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   []string
		sets  []Set
		setBy map[string]string
	}{
		{"nothing", nil, nil, nil},
		{"plain", []string{"SHADOW_MODE", " true "}, []Set{{"shadow-mode", "true"}}, map[string]string{"shadow-mode": "SHADOW_MODE"}},
		{"ports keep the default host", []string{"GRPC_PORT", "9000", "DEBUG_PORT", "7000", "HOST", "0.0.0.0"},
			[]Set{{"grpc-addr", ":9000"}, {"http-addr", "0.0.0.0:8080"}, {"debug-addr", "127.0.0.1:7000"}}, nil},
		{"config dir and xDS", []string{"RUNTIME_ROOT", "/d", "RUNTIME_SUBDIRECTORY", "s", "CONFIG_TYPE", "grpc_xds_sotw", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"},
			[]Set{{"xds-tls", "true"}, {"config", "/d/s/config"}, {"config-source", "xds"}, {"xds-tls-cert", "/c"}}, map[string]string{"xds-tls": "CONFIG_GRPC_XDS_SERVER_USE_TLS"}},
		{"xDS files without TLS", []string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"}, nil, nil},
		{"redis cluster", []string{"REDIS_TYPE", "cluster", "REDIS_URL", "a:1, b:2", "REDIS_AUTH", "u:p", "REDIS_TLS", "true"},
			[]Set{{"backend", "redis"}, {"redis-mode", "cluster"}, {"redis-addrs", "a:1,b:2"}, {"redis-url", "rediss://u:p@a:1"}},
			map[string]string{"redis-url": "REDIS_URL", "redis-addrs": "REDIS_URL"}},
		{"redis sentinel", []string{"REDIS_TYPE", "sentinel", "REDIS_URL", "m,s1:26379,s2:26379"},
			[]Set{{"backend", "redis"}, {"redis-mode", "sentinel"}, {"redis-master", "m"}, {"redis-addrs", "s1:26379,s2:26379"}, {"redis-url", "redis://s1:26379"}},
			map[string]string{"redis-url": "REDIS_URL", "redis-addrs": "REDIS_URL"}},
		{"redis socket", []string{"BACKEND_TYPE", "redis", "REDIS_URL", "/tmp/r.sock"},
			[]Set{{"backend", "redis"}, {"redis-mode", "standalone"}, {"redis-url", "unix:///tmp/r.sock"}},
			map[string]string{"redis-url": "REDIS_URL", "redis-addrs": "REDIS_URL"}},
		{"answers", []string{"LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_RESET_HEADER", "X-Reset", "LOG_LEVEL", "WARNING", "LOCAL_CACHE_SIZE_IN_BYTES", "1000", "CACHE_KEY_PREFIX", "p_"},
			[]Set{{"local-cache-size", "7"}, {"key-prefix", "p_"}, {"headers", "legacy"}, {"legacy-reset-header", "X-Reset"}, {"log-level", "warn"}}, nil},
		{"metrics", []string{"USE_STATSD", "true", "STATSD_PORT", "9125", "STATS_FLUSH_INTERVAL", "1m", "EXTRA_TAGS", "a:b", "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", ":9999"},
			[]Set{{"statsd-addr", "localhost:9125"}, {"statsd-tags", "a:b"}, {"statsd-flush-interval", "1m0s"}, {"metrics-addr", ":9999"}}, nil},
		{"grpc TLS", []string{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "/c", "GRPC_SERVER_TLS_KEY", "/k"},
			[]Set{{"grpc-tls-cert", "/c"}, {"grpc-tls-key", "/k"}, {"grpc-tls-client-ca", ""}, {"grpc-tls-client-san", ""}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := ReadEnv(lookupOf(tc.env...), plainTable, defaults)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.sets, e.Sets); diff != "" {
				t.Errorf("sets (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.setBy, e.SetBy); diff != "" {
				t.Errorf("set by (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReadEnvErrors: every malformed variable is reported, each as
// NAME="value"; a credential is never quoted.
func TestReadEnvErrors(t *testing.T) {
	_, err := ReadEnv(lookupOf("SHADOW_MODE", "maybe", "GRPC_PORT", "http", "USE_STATSD", "yes please", "DISABLE_STATS", "x", "MEMCACHE_TLS", "true", "LOG_LEVEL", "loud"), plainTable, defaults)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`SHADOW_MODE="maybe"`, `GRPC_PORT="http"`, `USE_STATSD="yes please"`, `DISABLE_STATS="x"`, "MEMCACHE_TLS=true", `LOG_LEVEL="loud"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	_, err = ReadEnv(lookupOf("REDIS_URL", "user:s3cr3t@host:1"), plainTable, defaults)
	if err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("REDIS_URL with a password: %v", err)
	}
}

// TestReadEnvStatsdReference: the reference's statsd: USE_STATSD unset
// sends (reference mode) to STATSD_HOST:STATSD_PORT, and native mode warns
// that it does not.
func TestReadEnvStatsdReference(t *testing.T) {
	e, err := ReadEnv(lookupOf("STATSD_HOST", "sink", "TRACING_SERVICE_NAMESPACE", "ns"), plainTable, defaults)
	if err != nil {
		t.Fatal(err)
	}
	if e.StatsdReferenceAddr != "sink:8125" || e.Has("statsd-addr") {
		t.Errorf("reference addr %q, sets %v", e.StatsdReferenceAddr, e.Sets)
	}
	if len(e.Warnings) != 1 || !strings.Contains(e.Warnings[0], "STATSD_HOST"+statsdOnlyWithUse) || !strings.Contains(e.Warnings[0], "TRACING_SERVICE_NAMESPACE") {
		t.Errorf("warnings %q", e.Warnings)
	}
	ws := ReferenceWarnings(e.Warnings)
	if len(ws) != 1 || strings.Contains(ws[0], "STATSD_HOST") || !strings.Contains(ws[0], "TRACING_SERVICE_NAMESPACE") {
		t.Errorf("reference warnings %q", ws)
	}
	e, _ = ReadEnv(lookupOf("STATSD_HOST", "sink"), plainTable, defaults)
	if ws := ReferenceWarnings(e.Warnings); len(ws) != 0 {
		t.Errorf("reference warnings %q, want none", ws)
	}
	for _, off := range [][]string{{"USE_STATSD", "false"}, {"DISABLE_STATS", "true"}, {"USE_PROMETHEUS", "true"}, {"USE_DOG_STATSD", "true"}} {
		if e, _ := ReadEnv(lookupOf(off...), plainTable, defaults); e.StatsdReferenceAddr != "" {
			t.Errorf("%v: reference addr %q, want none", off, e.StatsdReferenceAddr)
		}
	}
}

// TestResolve: Resolve's rule and the defaults reference mode sets, each
// skipped when a flag, twin or reference variable set it.
func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       ModeInput
		env      []string
		ref      bool
		reason   string
		defaults []Set
	}{
		{"native, nothing set", ModeInput{Mode: ModeAuto}, nil, false, "no envoyproxy/ratelimit variable set", nil},
		{"own config outranks", ModeInput{Mode: ModeAuto, Explicit: map[string]bool{"config": true}}, []string{"RUNTIME_ROOT", "/d"}, false, "outranks RUNTIME_ROOT", nil},
		{"forced native by twin", ModeInput{Mode: ModeNative, From: "RATELIMITD_MODE"}, []string{"RUNTIME_ROOT", "/d"}, false, "RATELIMITD_MODE=native", nil},
		{"binary name", ModeInput{Mode: ModeAuto, AsRef: true}, []string{"USE_STATSD", "false"}, true, "invoked as ratelimit",
			[]Set{{"headers", "none"}, {"legacy-limit-header", "RateLimit-Limit"}, {"legacy-remaining-header", "RateLimit-Remaining"}, {"legacy-reset-header", "RateLimit-Reset"},
				{"problem-body", "false"}, {"counting", "always_charge"}, {"config", ReferenceConfigDir}, {"ignore-dotfiles", "false"}, {"memcache-timeout", "500ms"},
				{"backend", "redis"}, {"redis-mode", "standalone"}, {"redis-url", "unix:///var/run/nutcracker/ratelimit.sock"}}},
		{"variables and own flags", ModeInput{Mode: ModeAuto, Explicit: map[string]bool{"headers": true, "problem-body": true, "counting": true, "memcache-timeout": true, "ignore-dotfiles": true}},
			[]string{"RUNTIME_ROOT", "/d", "BACKEND_TYPE", "memcache", "STATSD_HOST", "s", "LIMIT_LIMIT_HEADER", "Quota"}, true, "variables set: RUNTIME_ROOT, BACKEND_TYPE",
			[]Set{{"legacy-remaining-header", "RateLimit-Remaining"}, {"legacy-reset-header", "RateLimit-Reset"}, {"statsd-addr", "s:8125"}}},
		{"stop increment", ModeInput{Mode: ModeReference}, []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true", "LIMIT_RESPONSE_HEADERS_ENABLED", "false", "RUNTIME_ROOT", "/d", "REDIS_URL", "r:1", "USE_STATSD", "true"}, true, "--mode=reference",
			[]Set{{"legacy-limit-header", "RateLimit-Limit"}, {"legacy-remaining-header", "RateLimit-Remaining"}, {"legacy-reset-header", "RateLimit-Reset"},
				{"problem-body", "false"}, {"counting", "all_or_nothing"}, {"ignore-dotfiles", "false"}, {"memcache-timeout", "500ms"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := lookupOf(tc.env...)
			e, err := ReadEnv(lookup, plainTable, defaults)
			if err != nil {
				t.Fatal(err)
			}
			tc.in.Env, tc.in.Lookup = e, lookup
			m, err := Resolve(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if m.Reference != tc.ref || !strings.Contains(m.Reason, tc.reason) {
				t.Errorf("reference %v (%q), want %v (%q)", m.Reference, m.Reason, tc.ref, tc.reason)
			}
			if diff := cmp.Diff(tc.defaults, m.Defaults); diff != "" {
				t.Errorf("defaults (-want +got):\n%s", diff)
			}
			msg, attrs := m.Log()
			want := map[bool]string{true: ModeReference, false: ModeNative}[tc.ref]
			if msg == "" || attrs[1] != want || attrs[3] != m.Reason {
				t.Errorf("log %q %v", msg, attrs)
			}
		})
	}
	if _, err := Resolve(ModeInput{Mode: "compat"}); err == nil || !strings.Contains(err.Error(), "--mode") {
		t.Errorf("--mode=compat: %v", err)
	}
}

// TestAnnotate: Annotate names the variable behind each line about a flag
// it set.
func TestAnnotate(t *testing.T) {
	setBy := map[string]string{"gc-percent": "RATELIMITD_GC_PERCENT", "near-limit-ratio": "NEAR_LIMIT_RATIO"}
	err := Annotate(errors.Join(errors.New("--gc-percent=-1: bad"), errors.New("--near-limit-ratio: too big"), errors.New("--other: x")), setBy)
	want := "--gc-percent=-1: bad (set by RATELIMITD_GC_PERCENT)\n--near-limit-ratio: too big (set by NEAR_LIMIT_RATIO)\n--other: x"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
	if Annotate(nil, setBy) != nil {
		t.Error("nil annotated")
	}
	plain := errors.New("--other: x")
	if Annotate(plain, setBy) != plain {
		t.Error("an error naming no such flag was rewritten")
	}
}

// TestUnknownTwins: UnknownTwins names the RATELIMITD_* variables that are
// no flag's twin.
func TestUnknownTwins(t *testing.T) {
	twins := map[string]bool{"RATELIMITD_REDIS_URL": true}
	w := UnknownTwins([]string{"PATH=/bin", "RATELIMITD_REDIS_ULR=x", "RATELIMITD_REDIS_URL=y", "RATELIMITD_REQUIRE_REDIS=1", "RATELIMITD_A=1"}, twins)
	if w != "RATELIMITD_* environment variables that match no serve flag (ignored; misspelled?): RATELIMITD_A, RATELIMITD_REDIS_ULR" {
		t.Errorf("warning %q", w)
	}
	if w := UnknownTwins([]string{"RATELIMITD_REDIS_URL=y"}, twins); w != "" {
		t.Errorf("warning %q, want none", w)
	}
}

// TestInvokedAsReference: a binary named ratelimit, on any path, is the
// reference's; any other name is not.
func TestInvokedAsReference(t *testing.T) {
	for argv0, want := range map[string]bool{"/bin/ratelimit": true, "ratelimit": true, "/usr/bin/ratelimitd": false, "ratelimit.sh": false} {
		if got := InvokedAsReference(argv0); got != want {
			t.Errorf("%s: %v, want %v", argv0, got, want)
		}
	}
}

// TestValidateMode: validate's mode: serve's rule, with RATELIMITD_CONFIG
// as --config.
func TestValidateMode(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		env    []string
		ref    bool
		reason string
	}{
		{ModeAuto, nil, false, "no envoyproxy/ratelimit variable set"},
		{ModeAuto, []string{"REDIS_URL", "r:1"}, true, "envoyproxy/ratelimit variables set: REDIS_URL"},
		{ModeAuto, []string{"REDIS_URL", "r:1", "RATELIMITD_CONFIG_SOURCE", "file"}, false, "RATELIMITD_CONFIG_SOURCE given"},
		{ModeReference, nil, true, "--mode=reference"},
		{ModeNative, []string{"RUNTIME_ROOT", "/d"}, false, "--mode=native"},
	} {
		ref, reason, err := ValidateMode(tc.mode, lookupOf(tc.env...))
		if err != nil || ref != tc.ref || reason != tc.reason {
			t.Errorf("%s %v: %v %q %v, want %v %q", tc.mode, tc.env, ref, reason, err, tc.ref, tc.reason)
		}
	}
	if _, _, err := ValidateMode("compat", lookupOf()); err == nil {
		t.Error("--mode=compat: no error")
	}
}

// TestConfigPaths: the paths validate checks in reference mode.
func TestConfigPaths(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want []string
		err  string
	}{
		{nil, []string{ReferenceConfigDir}, ""},
		{[]string{"RUNTIME_ROOT", "/d", "RUNTIME_APPDIRECTORY", "rl"}, []string{"/d/rl"}, ""},
		{[]string{"RUNTIME_ROOT", "/d", "RATELIMITD_CONFIG", " /a, ,/b"}, []string{"/a", "/b"}, ""},
		{[]string{"CONFIG_TYPE", "GRPC_XDS_SOTW"}, nil, "CONFIG_TYPE=GRPC_XDS_SOTW"},
		{[]string{"CONFIG_TYPE", "GRPC_XDS_SOTW", "RATELIMITD_CONFIG_SOURCE", "file"}, []string{ReferenceConfigDir}, ""},
	} {
		got, err := ConfigPaths(lookupOf(tc.env...))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || !cmp.Equal(got, tc.want) {
			t.Errorf("%v: %v %v, want %v", tc.env, got, err, tc.want)
		}
	}
}
