package main

import (
	"io"
	"strings"
	"testing"
)

// serveErr is parseServe's error for args and the environment kv (pairs),
// failing t when parseServe accepts them.
func serveErr(t *testing.T, args []string, kv ...string) string {
	t.Helper()
	_, _, err := parseServe(args, env(kv...), io.Discard)
	if err == nil {
		t.Fatalf("parseServe(%q, %q) accepted", args, kv)
	}
	return err.Error()
}

// An unpaired Redis client certificate or key is refused under every
// backend, from the flags and from envoyproxy/ratelimit's variables.
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
