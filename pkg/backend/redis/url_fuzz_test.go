package redis_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// plantedSecret is the password FuzzURL plants in a Redis URL, and
// plantedTwin another text of the same shape: digits where the secret has
// them, upper and lower case letters that are not hex digits where it has
// them, so a URL parses the same way with either, and any difference
// between their errors is a part of the URL quoted back.
const (
	plantedSecret = "Pw7Szqrut9"
	plantedTwin   = "Kx7Twpvsy9"
)

// urlSeeds plant the secret (as "PW") in every field of a Redis URL and
// in the malformed shapes operators write: a typo in the scheme, a
// missing scheme, one slash, an empty host, an opaque URL, a fragment.
var urlSeeds = []string{
	"redis://:PW@127.0.0.1:6379/0",
	"redis://user:PW@redis:6379/0",
	"rediss://PW@redis:6380/0",
	"redis://PW:pw@redis:6379/0",
	"PW://:pw@redis:6379/0",
	"redis://PW:6379/0",
	"redis://redis:PW/0",
	"redis://redis:6379/PW",
	"redis://redis:6379/0?PW=1",
	"redis://redis:6379/0?client_name=PW",
	"redis://redis:6379/0?db=PW",
	"redis://:pw@redis:6379/0#PW",
	"redis://redis:6379/0#:PW@",
	"unix://:PW@/var/run/redis.sock",
	"unix://PW@host/var/run/redis.sock",
	"redis//:PW@host",
	"redis//:PW@host:6379",
	":PW@host",
	":PW@host:6379",
	"redis:/:PW@host",
	"redis:://:PW@127.0.0.1:6379",
	"redis:PW@host",
	"redis://:PW@",
	"redis://:PW@:6379",
	"redis://:PW@/0",
	"redis://u:PW@127.0.0.1:bad/0",
	"redis://:PW@[::1/0",
	"redis://u:PW\x01@127.0.0.1:1/0",
	"redis://u:PW%40127.0.0.1:16380",
	"redis://u:PW%zz@host",
	"redis://u:PW@h%zz",
	"redis://u:PW@ho st:6379",
	"redis://u:PW@host:6379/0?db=1;x=2",
	"redis://u:PW@host:6379/0/1",
	" redis://:PW@host",
	"REDIS://:PW@host",
	"redis://:PW@host@other:6379",
	"redis://:PW:more@host:6379",
	"http://:PW@host:6379",
}

// FuzzURL: wherever a password lands in a Redis URL, well formed or not,
// (1) an error about the URL never quotes it, nor anything else of the
// URL (the error is the same whatever the planted text), and CheckURL
// gives the same verdict for both; (2) RedactURL never shows it, except
// where the URL that CheckURL accepted holds it in a field that is not a
// secret (scheme, host, port, path, the user of user:password, a query
// option's name), and shows a refused URL as "xxxxx" alone; (3) the
// Options error (Validate) and New's error never hold it.
func FuzzURL(f *testing.F) {
	for _, s := range urlSeeds {
		before, after, _ := strings.Cut(s, "PW")
		f.Add(before, after)
	}
	f.Fuzz(func(t *testing.T, before, after string) {
		raw, twin := before+plantedSecret+after, before+plantedTwin+after
		for _, needHost := range []bool{true, false} {
			err, errTwin := redis.CheckURL(raw, needHost), redis.CheckURL(twin, needHost)
			if (err == nil) != (errTwin == nil) {
				t.Fatalf("CheckURL(needHost %v) depends on the planted text: %v vs %v", needHost, err, errTwin)
			}
			if err != nil && err.Error() != errTwin.Error() {
				t.Fatalf("CheckURL(needHost %v) quotes the URL: %q vs %q", needHost, err, errTwin)
			}
		}
		red := redis.RedactURL(raw)
		if err := redis.CheckURL(raw, false); err != nil {
			if red != "xxxxx" {
				t.Fatalf("RedactURL of a refused URL = %q, want xxxxx", red)
			}
		} else if strings.Contains(red, plantedSecret) && !inPublicField(t, raw) {
			t.Fatalf("RedactURL(%q) = %q shows the password", raw, red)
		}
		o := redis.DefaultOptions()
		o.URL = raw
		if err := o.Validate(); err != nil && strings.Contains(err.Error(), plantedSecret) {
			t.Fatalf("Validate error holds the password: %v", err)
		}
		if err := redis.CheckURL(raw, true); err != nil {
			if _, err := redis.New(o); err == nil || strings.Contains(err.Error(), plantedSecret) {
				t.Fatalf("New: %v, want an error without the password", err)
			}
		}
	})
}

// inPublicField reports whether the planted secret is in a field of raw (a
// URL CheckURL accepted) that RedactURL shows.
func inPublicField(t *testing.T, raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("CheckURL accepted %q, which net/url refuses: %v", raw, err)
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
	return slices.ContainsFunc(public, func(s string) bool { return strings.Contains(s, plantedSecret) })
}

// TestURLHostRequired: in standalone mode a URL without a host is
// refused (go-redis would dial localhost:6379); in sentinel and cluster
// modes, where the URL only supplies credentials, TLS and DB, it is
// accepted when it is otherwise well formed, and a malformed one is still
// refused.
func TestURLHostRequired(t *testing.T) {
	for _, raw := range []string{"redis://:pw@", "redis://:pw@:6379", "redis://:pw@/0", "rediss://u:pw@:6380/0"} {
		o := redis.DefaultOptions()
		o.URL = raw
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "no host") {
			t.Errorf("standalone %s: %v, want refused for having no host", redis.RedactURL(raw), err)
		}
		for _, mode := range []redis.Mode{redis.Sentinel, redis.Cluster} {
			o.Mode, o.Addrs, o.MasterName = mode, []string{"127.0.0.1:26379"}, "m"
			if err := o.Validate(); err != nil {
				t.Errorf("%s %s: %v, want accepted (the URL only supplies credentials)", mode, redis.RedactURL(raw), err)
			}
		}
	}
	for _, raw := range []string{"redis:://:pw@127.0.0.1:6379", "redis//:pw@host", ":pw@host", "redis:/:pw@host", "redis://:pw@h/0#x"} {
		for _, mode := range []redis.Mode{redis.Standalone, redis.Sentinel, redis.Cluster} {
			o := redis.DefaultOptions()
			o.URL, o.Mode = raw, mode
			if mode != redis.Standalone {
				o.Addrs, o.MasterName = []string{"127.0.0.1:26379"}, "m"
			}
			err := o.Validate()
			if err == nil || strings.Contains(err.Error(), "pw") {
				t.Errorf("%s, malformed URL #%d: %v, want refused without quoting it", mode, len(raw), err)
			}
		}
	}
}

// TestURLPortRange: a port net/url accepts but no dial can use is refused
// at validation, without quoting the URL.
func TestURLPortRange(t *testing.T) {
	for _, raw := range []string{"redis://:pw@127.0.0.1:99999/0", "rediss://:pw@127.0.0.1:0/0", "redis://:pw@h:65536"} {
		o := redis.DefaultOptions()
		o.URL = raw
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), "port outside 1..65535") || strings.Contains(err.Error(), "pw") {
			t.Errorf("port of URL #%d: %v, want refused for its port without quoting it", len(raw), err)
		}
	}
	for _, raw := range []string{"redis://127.0.0.1:1/0", "redis://127.0.0.1:65535/0", "redis://127.0.0.1/0"} {
		o := redis.DefaultOptions()
		o.URL = raw
		if err := o.Validate(); err != nil {
			t.Errorf("%s: %v, want accepted", raw, err)
		}
	}
}
