package redis_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestPasswordFileRotation: with Options.PasswordFile the Store
// authenticates with the file's password (trailing newline ignored, the
// URL carrying none), and after the password is rotated on the server and
// in the file, and every connection is killed, it reconnects with the new
// one without being rebuilt. The counter is exact across the rotation.
func TestPasswordFileRotation(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t, redistest.WithPassword("first-Secret-1"))
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte("first-Secret-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := redis.DefaultOptions()
	o.URL = "redis://" + srv.Addr() + "/0"
	o.PasswordFile = file
	o.Timeout = time.Second
	s := openStore(t, o)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	// takeOK retries a Take until it succeeds (a killed connection fails
	// the call that finds it dead): it returns the successful decision.
	takeOK := func(what string) algo.Decision {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "rotate", Limit: l, Cost: 1}})
			if err == nil {
				return d[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no successful Take in 10 s: %v", what, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if d := takeOK("first password"); d.Remaining != 999 {
		t.Fatalf("first Take: remaining %d, want 999", d.Remaining)
	}

	ctl := srv.Client()
	ctx := context.Background()
	if err := os.WriteFile(file, []byte("second-Secret-2\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ctl.ConfigSet(ctx, "requirepass", "second-Secret-2").Err(); err != nil {
		t.Fatal(err)
	}
	// Kill every client connection but ctl's own.
	killed, err := ctl.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Int()
	if err != nil || killed == 0 {
		t.Fatalf("CLIENT KILL: %d killed, %v; want the Store's connections gone", killed, err)
	}
	if d := takeOK("rotated password"); d.Remaining != 998 {
		t.Fatalf("Take after rotation: remaining %d, want 998 (one hit counted before, none lost or doubled)", d.Remaining)
	}
}

// TestPasswordFileErrors: a missing, empty or multi-line password file fails New with
// an error that names the file and never holds a password.
func TestPasswordFileErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	multi := filepath.Join(dir, "multi")
	if err := os.WriteFile(multi, []byte("LINE1SECRET\nLINE2SECRET\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(dir, "missing"), empty, multi} {
		o := redis.DefaultOptions()
		o.URL = "redis://127.0.0.1:1/0"
		o.PasswordFile = f
		_, err := redis.New(o)
		if err == nil || !strings.Contains(err.Error(), f) || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("PasswordFile %s: err %v, want one naming the file and not its content", f, err)
		}
	}
}

// TestURLErrorsRedacted: a Redis URL that does not parse is refused with an
// error that quotes neither its password nor the URL with it, although
// go-redis and net/url quote the whole URL.
func TestURLErrorsRedacted(t *testing.T) {
	const pw = "Hunter2-Secret"
	for _, u := range []string{
		"redis://user:" + pw + "@127.0.0.1:bad/0",
		"redis://:" + pw + "@[::1/0",
		"redis://user:" + pw + "@127.0.0.1:6379/notadb",
		"rediss://user:" + pw + "@127.0.0.1:6379/0?unknown=1",
		"default:" + pw + "@redis:6379",          // no scheme
		"redis//default:" + pw + "@redis:6379",   // a typo in the scheme
		"redis:/default:" + pw + "@redis:6379",   // one slash
		"redis://u:" + pw + "\x01@127.0.0.1:1/0", // a control character, quoted escaped by net/url
		"redis://u:" + pw + "%40127.0.0.1:16380", // a bad escape
	} {
		o := redis.DefaultOptions()
		o.URL = u
		err := o.Validate()
		if err == nil {
			t.Errorf("%s: accepted", redis.RedactURL(u))
			continue
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), "@") {
			t.Errorf("Validate error leaks the password or quotes the URL: %v", err)
		}
		if _, err := redis.New(o); err == nil || strings.Contains(err.Error(), pw) {
			t.Errorf("New error missing or leaks the password: %v", err)
		}
	}
	if got, want := redis.RedactURL("redis://u:"+pw+"@h:6379/0"), "redis://u:xxxxx@h:6379/0"; got != want {
		t.Errorf("RedactURL = %q, want %q", got, want)
	}
	if got := redis.URLPassword("redis://u:" + pw + "@h:bad/0"); got != pw {
		t.Errorf("URLPassword of an unparsable URL = %q, want the password", got)
	}
}
