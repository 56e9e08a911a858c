package serveopts

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/secrets"
)

// credentialName matches the setting names that may carry a credential:
// a URL or address (user info), an auth value, headers.
var credentialName = regexp.MustCompile(`(^|-)(url|addr|addrs|auth|headers|endpoint|srv|token|password|secret)$`)

// notCredentials are the settings credentialName matches that carry none:
// addresses ratelimitd listens on, and --headers (which response headers
// to send).
var notCredentials = map[string]bool{"grpc-addr": true, "http-addr": true, "debug-addr": true, "metrics-addr": true, "headers": true}

// TestSecretSettingsDeclared: every setting whose name says it may carry
// a credential declares a secret kind, so redaction follows the table;
// and for each setting that declares one, a credential planted in its
// value is gone from the redacted command line, from flagEquals (errors)
// and from secrets.Redact (logs), while its flag name stays.
func TestSecretSettingsDeclared(t *testing.T) {
	const pw = "Planted-Pw9"
	declared := 0
	for _, s := range settings {
		if credentialName.MatchString(s.name) && !notCredentials[s.name] && s.secret == secrets.None {
			t.Errorf("--%s may carry a credential but declares no secret kind", s.name)
		}
		if s.secret == secrets.None {
			continue
		}
		declared++
		var v string
		switch s.secret {
		case secrets.Whole:
			v = "admin:" + pw
		case secrets.RedisURL:
			v = "redis://u:" + pw + "@h:6379/0"
		case secrets.Address:
			v = "h1:1,u:" + pw + "@h2:2,scheme://" + pw + "@h3:3"
		case secrets.Headers:
			v = "authorization:Bearer " + pw + ",x-k:" + pw
		case secrets.PostgresURL:
			v = "postgres://u:" + pw + "@h:5432/db?sslmode=disable&sslpassword=" + pw
		}
		for _, args := range [][]string{{"rl", "--" + s.name + "=" + v}, {"rl", "-" + s.name, v}} {
			got := secrets.RedactArgs(args, SecretKindOf)
			if strings.Contains(strings.Join(got, " "), pw) || !strings.Contains(got[1], s.name) {
				t.Errorf("--%s: redacted command line %q", s.name, got)
			}
		}
		if e := flagEquals(s.name, v); strings.Contains(e, pw) || !strings.HasPrefix(e, "--"+s.name) {
			t.Errorf("--%s: flagEquals = %q", s.name, e)
		}
		if r := secrets.Redact(s.secret, v); strings.Contains(r, pw) {
			t.Errorf("--%s: secrets.Redact = %q", s.name, r)
		}
		if !slices.Contains(secrets.Parts(s.secret, v), pw) {
			t.Errorf("--%s: secrets.Parts(%q) = %q, want the credential among them (scrubbed from errors)", s.name, v, secrets.Parts(s.secret, v))
		}
	}
	if declared < 5 {
		t.Errorf("%d settings declare a secret kind, want at least redis-url, redis-sentinel-auth, xds-headers and the addresses", declared)
	}
}

// Planted by FuzzServeRedisURL: as in the redis package's FuzzURL, two
// texts of the same shape (digits, non-hex letters), so the URL parses
// alike with either.
const (
	servePlanted = "Pw7Szqrut9"
	serveTwin    = "Kx7Twpvsy9"
)

// FuzzServeRedisURL: a Redis URL with a password planted anywhere, given
// as --redis-url, its twin or the reference's REDIS_URL, is either refused
// with an error that quotes nothing of the URL, or accepted with a startup
// log line, command line and errors that show the password nowhere but in
// a field that is no secret (host, port, path, scheme, user, option name).
func FuzzServeRedisURL(f *testing.F) {
	for _, s := range []string{
		"redis//:PW@host", ":PW@host", "redis:/:PW@host", "redis:://:PW@127.0.0.1:6379", "redis:PW@host",
		"redis://:PW@", "redis://:PW@:6379", "redis://u:PW@127.0.0.1:bad/0", "redis://u:PW%zz@host",
		"redis://:PW@host:6379/0", "redis://PW@host:6379/0", "rediss://PW:x@host:6380/0", "redis://host:6379/0#PW",
		"redis://host:6379/0?client_name=PW", "redis://host:6379/PW", "PW://host", "redis://PW:6379", "host:6379,PW",
	} {
		before, after, _ := strings.Cut(s, "PW")
		f.Add(before, after, uint8(0))
	}
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, before, after string, how uint8) {
		parse := func(secret string) (Options, error) {
			raw := before + secret + after
			switch how % 3 {
			case 0:
				o, _, err := Parse([]string{"--backend=redis", "--redis-url=" + raw, "--config=" + dir}, env(), io.Discard)
				return o, err
			case 1:
				o, _, err := Parse([]string{"--backend=redis", "--config=" + dir}, env("RATELIMITD_REDIS_URL", raw), io.Discard)
				return o, err
			default:
				o, _, err := Parse(nil, env("BACKEND_TYPE", "redis", "REDIS_URL", raw, "RUNTIME_ROOT", dir, "RUNTIME_SUBDIRECTORY", "x"), io.Discard)
				return o, err
			}
		}
		o, err := parse(servePlanted)
		_, errTwin := parse(serveTwin)
		if (err == nil) != (errTwin == nil) {
			t.Fatalf("the verdict depends on the planted text: %v vs %v", err, errTwin)
		}
		if err != nil {
			if strings.Contains(err.Error(), servePlanted) {
				t.Fatalf("error holds the password: %v", err)
			}
			if strings.ReplaceAll(err.Error(), servePlanted, serveTwin) != strings.ReplaceAll(errTwin.Error(), servePlanted, serveTwin) {
				t.Fatalf("error quotes the URL: %q vs %q", err, errTwin)
			}
			return
		}
		shown := []string{fmt.Sprint(BackendTarget(o)), strings.Join(secrets.RedactArgs([]string{"rl", "--redis-url=" + o.Redis.URL}, SecretKindOf), " "), flagEquals("redis-url", o.Redis.URL)}
		for _, sh := range shown {
			if strings.Contains(sh, servePlanted) && !publicInURL(o.Redis.URL, o.Redis.Addrs) {
				t.Fatalf("accepted %q, then shown with its password: %s", o.Redis.URL, sh)
			}
		}
	})
}

// publicInURL reports whether servePlanted is in a field of the accepted
// Redis URL (or an address) that is shown.
func publicInURL(raw string, addrs []string) bool {
	if slices.ContainsFunc(addrs, func(a string) bool { return strings.Contains(a, servePlanted) }) {
		return true
	}
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	public := []string{u.Scheme, u.Host, u.Path}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			public = append(public, u.User.Username())
		}
	}
	for k := range u.Query() {
		public = append(public, k)
	}
	return slices.ContainsFunc(public, func(s string) bool { return strings.Contains(s, servePlanted) })
}
