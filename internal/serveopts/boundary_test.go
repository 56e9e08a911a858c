package serveopts

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/secrets"
)

// TestRedactArgs: every form the flag package accepts for a secret flag is
// redacted; other flags and positional words stay.
func TestRedactArgs(t *testing.T) {
	const pw = "S3cret-pw"
	in := []string{"ratelimitd", "serve",
		"--redis-url=redis://user:" + pw + "@h:6379/0",
		"-redis-url", "rediss://:" + pw + "@h:6380/1",
		"--redis-sentinel-auth", "admin:" + pw,
		"-redis-sentinel-auth=" + pw,
		"--redis-url=redis://u:" + pw + "@h:bad/0", // does not parse
		"--config", "/etc/rl", "--key-prefix=" + "k",
	}
	got := secrets.RedactArgs(in, SecretKindOf)
	joined := strings.Join(got, " ")
	if strings.Contains(joined, pw) {
		t.Fatalf("a secret survived: %q", got)
	}
	for _, want := range []string{"--redis-url=redis://user:xxxxx@h:6379/0", "rediss://:xxxxx@h:6380/1", "-redis-sentinel-auth=xxxxx", "--config", "/etc/rl", "--key-prefix=k"} {
		if !strings.Contains(joined, want) {
			t.Errorf("redacted command line %q lacks %q", joined, want)
		}
	}
	if in[2] != "--redis-url=redis://user:"+pw+"@h:6379/0" {
		t.Error("secrets.RedactArgs changed its input")
	}
	rec := httptest.NewRecorder()
	secrets.CmdlineHandler(in, SecretKindOf).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/cmdline", nil))
	if body := rec.Body.String(); strings.Contains(body, pw) || !strings.Contains(body, "serve\x00") {
		t.Errorf("cmdline body %q: want NUL-separated arguments without the secret", body)
	}
}

// TestRedisFlagsNeedRedisBackend: a Redis flag or twin without --backend
// is refused (each replica would count alone on the memory store);
// --backend=memory given explicitly, or the reference's REDIS_URL (which
// selects Redis), is accepted.
func TestRedisFlagsNeedRedisBackend(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	for _, c := range []struct {
		args    []string
		env     func(string) (string, bool)
		wantErr bool
	}{
		{[]string{"--redis-url=redis://127.0.0.1:1/0"}, env(), true},
		{nil, env("RATELIMITD_REDIS_URL", "redis://127.0.0.1:1/0"), true},
		{[]string{"--redis-mode=cluster", "--redis-addrs=a:1"}, env(), true},
		{[]string{"--backend=memory", "--redis-url=redis://127.0.0.1:1/0"}, env(), false},
		{[]string{"--backend=redis", "--redis-url=redis://127.0.0.1:1/0"}, env(), false},
		{[]string{"--config=x"}, env("REDIS_URL", "127.0.0.1:6379", "REDIS_SOCKET_TYPE", "tcp"), false},
	} {
		o, _, err := Parse(c.args, c.env, io.Discard)
		if (err != nil) != c.wantErr {
			t.Errorf("%v: err %v (backend %s), want error %v", c.args, err, o.Backend, c.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "--backend=redis") {
			t.Errorf("%v: %v, want a hint naming --backend=redis", c.args, err)
		}
	}
}
