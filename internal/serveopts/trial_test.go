package serveopts

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// serveErr is Parse's error for args and the environment kv (pairs),
// failing t when Parse accepts them.
func serveErr(t *testing.T, args []string, kv ...string) string {
	t.Helper()
	_, _, err := Parse(args, env(kv...), io.Discard)
	if err == nil {
		t.Fatalf("Parse(%q, %q) accepted", args, kv)
	}
	return err.Error()
}

// TestRedisTLSPairUnderEveryBackend: an unpaired Redis client certificate
// or key is refused under every backend, from the flags and from
// envoyproxy/ratelimit's variables.
func TestRedisTLSPairUnderEveryBackend(t *testing.T) {
	for _, backend := range []string{"memory", "redis", "memcache"} {
		base := []string{"--config=.", "--backend=" + backend, "--memcache-addrs=127.0.0.1:11211", "--redis-url=rediss://127.0.0.1:6379"}
		for _, c := range []struct {
			args []string
			env  []string
		}{
			{[]string{"--redis-tls-cert=c.pem"}, nil},
			{[]string{"--redis-tls-key=k.pem"}, nil},
			{nil, []string{"REDIS_TLS_CLIENT_CERT", "c.pem"}},
			{nil, []string{"REDIS_TLS_CLIENT_KEY", "k.pem"}},
		} {
			got := serveErr(t, append(append([]string(nil), base...), c.args...), c.env...)
			if !strings.Contains(got, "--redis-tls-cert and --redis-tls-key go together") {
				t.Errorf("--backend=%s %q %q: error %q, want the pair named", backend, c.args, c.env, got)
			}
		}
	}
}

// TestLegacyBooleansAndGRPCTLS: a malformed boolean in any of
// envoyproxy/ratelimit's variables stops startup naming the variable, and
// GRPC_SERVER_USE_TLS=true without a certificate and key is refused rather
// than served in plaintext.
func TestLegacyBooleansAndGRPCTLS(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"GRPC_SERVER_USE_TLS", "maybe"}, `GRPC_SERVER_USE_TLS="maybe": `},
		{[]string{"USE_PROMETHEUS", "maybe"}, `USE_PROMETHEUS="maybe": `},
		{[]string{"USE_STATSD", "true", "USE_PROMETHEUS", "maybe"}, `USE_PROMETHEUS="maybe": `},
		{[]string{"DISABLE_STATS", "maybe"}, `DISABLE_STATS="maybe": `},
		{[]string{"USE_DOG_STATSD", "maybe"}, `USE_DOG_STATSD="maybe": `},
		{[]string{"GRPC_SERVER_USE_TLS", "true"}, "GRPC_SERVER_USE_TLS=true: needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"},
		{[]string{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "c.pem"}, "GRPC_SERVER_USE_TLS=true: needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"},
	} {
		if got := serveErr(t, []string{"--config=."}, c.env...); !strings.Contains(got, c.want) {
			t.Errorf("%q: error %q, want %q", c.env, got, c.want)
		}
	}
	o, _, err := Parse([]string{"--config=."}, env("GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "c.pem", "GRPC_SERVER_TLS_KEY", "k.pem"), io.Discard)
	if err != nil || o.GRPCTLSCert != "c.pem" || o.GRPCTLSKey != "k.pem" {
		t.Errorf("GRPC_SERVER_USE_TLS=true with both files: cert %q key %q err %v, want c.pem k.pem nil", o.GRPCTLSCert, o.GRPCTLSKey, err)
	}
}

// TestTracingSampleRatioRefusedUpFront: the tracing sample ratio is checked
// with the other options (before any backend is built), naming the flag or
// the variable that set it.
func TestTracingSampleRatioRefusedUpFront(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--tracing-sample-ratio=-1"}, nil, "--tracing-sample-ratio=-1: must be in [0, 1]"},
		{nil, []string{"RATELIMITD_TRACING_SAMPLE_RATIO", "1.5"}, "--tracing-sample-ratio=1.5: must be in [0, 1] (set by RATELIMITD_TRACING_SAMPLE_RATIO)"},
		{nil, []string{"TRACING_SAMPLING_RATE", "2"}, "--tracing-sample-ratio=2: must be in [0, 1] (set by TRACING_SAMPLING_RATE)"},
		{nil, []string{"NEAR_LIMIT_RATIO", "2"}, "(set by NEAR_LIMIT_RATIO)"},
	} {
		got := serveErr(t, append([]string{"--config=."}, c.args...), c.env...)
		if !strings.Contains(got, c.want) {
			t.Errorf("%q %q: error %q, want %q", c.args, c.env, got, c.want)
		}
	}
	// A flag replaces the variable's value: the error names the flag alone.
	got := serveErr(t, []string{"--config=.", "--tracing-sample-ratio=3"}, "TRACING_SAMPLING_RATE", "0.5")
	if want := "--tracing-sample-ratio=3: must be in [0, 1]"; !strings.Contains(got, want) || strings.Contains(got, "set by") {
		t.Errorf("flag over variable: error %q, want %q without a source", got, want)
	}
}

// TestMemcacheFlagsNeedBackend: the memcached server flags without
// --backend are refused as the Redis ones are: the memory store would count
// in each replica alone.
func TestMemcacheFlagsNeedBackend(t *testing.T) {
	for _, args := range [][]string{{"--memcache-addrs=127.0.0.1:11211"}, {"--memcache-srv=_memcache._tcp.example"}} {
		name := strings.TrimPrefix(strings.SplitN(args[0], "=", 2)[0], "--")
		want := "--" + name + " is set but the backend is the in-memory store (--backend defaults to memory): add --backend=memcache, or --backend=memory to count in this process only"
		if got := serveErr(t, append([]string{"--config=."}, args...)); !strings.Contains(got, want) {
			t.Errorf("%q: error %q, want %q", args, got, want)
		}
		if _, _, err := Parse(append([]string{"--config=.", "--backend=memory"}, args...), env(), io.Discard); err != nil {
			t.Errorf("%q with --backend=memory: %v", args, err)
		}
	}
}

// TestRangeMessagesStateTheRule: each refusal states the flag's whole rule:
// a value the message calls valid is accepted, and the flag's refused 0 is
// not called valid.
func TestRangeMessagesStateTheRule(t *testing.T) {
	xds := []string{"--config-source=xds"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--near-limit-ratio=-1"}, "--near-limit-ratio=-1: must be in (0, 1]"},
		{[]string{"--near-limit-ratio=1.5"}, "--near-limit-ratio=1.5: must be in (0, 1]"},
		{[]string{"--near-limit-ratio=0"}, "--near-limit-ratio=0: must be in (0, 1]"},
		{[]string{"--log-decisions-rate=-1"}, "--log-decisions-rate=-1: must be > 0 (lines per second)"},
		{[]string{"--fail-closed-retry-after=-1s"}, "--fail-closed-retry-after=-1s: must be > 0"},
		{append(xds, "--xds-backoff-initial=-1s"), "--xds-backoff-initial=-1s: must be > 0"},
		{append(xds, "--xds-connect-retry-interval=-1s"), "--xds-connect-retry-interval=-1s: must be > 0"},
		{append(xds, "--xds-backoff-max=-1s"), "--xds-backoff-max=-1s: must be >= --xds-backoff-initial (10s)"},
		{append(xds, "--xds-backoff-max=0s"), "--xds-backoff-max=0s: must be >= --xds-backoff-initial (10s)"},
		{append(xds, "--xds-backoff-max=1s"), "--xds-backoff-max=1s: must be >= --xds-backoff-initial (10s)"},
		{[]string{"--redis-min-idle-conns=-1"}, "--redis-min-idle-conns=-1: must be >= 0 (more than the pool size is capped to it)"},
	} {
		got := serveErr(t, append([]string{"--config=."}, c.args...))
		if got != c.want {
			t.Errorf("%q: error %q, want %q alone", c.args, got, c.want)
		}
	}
	// What the messages call valid is accepted.
	for _, args := range [][]string{
		{"--near-limit-ratio=1"}, {"--log-decisions-rate=0.5"}, {"--fail-closed-retry-after=1ms"},
		{"--redis-min-idle-conns=0"}, {"--backend=redis", "--redis-min-idle-conns=20"},
		append(xds, "--xds-backoff-initial=1ms", "--xds-backoff-max=1ms", "--xds-connect-retry-interval=1ms"),
	} {
		if _, _, err := Parse(append([]string{"--config=."}, args...), env(), io.Discard); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}

// TestServeHelpWords: serve -h names --memory-limit's value bytes and says
// --config takes a comma-separated list, as the previous release did.
func TestServeHelpWords(t *testing.T) {
	var usage bytes.Buffer
	if _, _, err := Parse([]string{"-h"}, env(), &usage); err == nil {
		t.Fatal("-h: no flag.ErrHelp")
	}
	for _, want := range []string{"  -memory-limit bytes\n", "YAML file or directory (repeatable, or comma-separated)"} {
		if !strings.Contains(usage.String(), want) {
			t.Errorf("-h lacks %q", want)
		}
	}
	o, _, err := Parse([]string{"--config=a,b"}, env(), io.Discard)
	if err != nil || strings.Join(o.Config, "|") != "a|b" {
		t.Errorf("--config=a,b: %q %v, want [a b]", o.Config, err)
	}
}
