package serveopts

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// durationFlags are the names of serve's time.Duration flags.
func durationFlags(t *testing.T) []string {
	t.Helper()
	o := Defaults()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	registerServeFlags(fs, &o)
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, ok := g.Get().(time.Duration); ok {
				names = append(names, f.Name)
			}
		}
	})
	if len(names) < 20 {
		t.Fatalf("only %d duration flags: %v", len(names), names)
	}
	return names
}

// TestDurationFlagErrors: every duration flag refuses a bare number the way
// its environment twin and envoyproxy/ratelimit's REDIS_TIMEOUT do:
// "missing unit", naming the flag and the value, whether the value follows
// "=" or comes as the next argument.
func TestDurationFlagErrors(t *testing.T) {
	for _, name := range durationFlags(t) {
		for _, args := range [][]string{{"--" + name + "=10"}, {"--" + name, "10"}} {
			_, _, err := Parse(args, env(), io.Discard)
			want := "--" + name + "=10: missing unit (e.g. 10ms or 10s)"
			if err == nil || err.Error() != want {
				t.Errorf("%q: error %v, want %q", args, err, want)
			}
		}
		_, _, err := Parse([]string{"--" + name + "=ten"}, env(), io.Discard)
		if want := "--" + name + "=ten: not a duration (e.g. 10ms, 1.5s, 2m, 1h30m)"; err == nil || err.Error() != want {
			t.Errorf("--%s=ten: error %v, want %q", name, err, want)
		}
		_, _, err = Parse(nil, env(envName(name), "10"), io.Discard)
		if want := envName(name) + `="10": missing unit (e.g. 10ms or 10s)`; err == nil || err.Error() != want {
			t.Errorf("%s=10: error %v, want %q", envName(name), err, want)
		}
		// A good value still reaches the option.
		if _, _, err := Parse([]string{"--" + name + "=250ms"}, env(), io.Discard); err != nil &&
			strings.Contains(err.Error(), "--"+name+"=250ms:") {
			t.Errorf("--%s=250ms: %v", name, err)
		}
	}
	_, _, err := Parse(nil, env("REDIS_TIMEOUT", "10"), io.Discard)
	if want := `REDIS_TIMEOUT="10": missing unit (e.g. 10ms or 10s)`; err == nil || err.Error() != want {
		t.Errorf("REDIS_TIMEOUT=10: error %v, want %q", err, want)
	}
	o, _, err := Parse([]string{"--redis-timeout", "7ms", "--drain=0"}, env(), io.Discard)
	if err != nil || o.Redis.Timeout != 7*time.Millisecond || o.Drain != 0 {
		t.Errorf("--redis-timeout 7ms --drain=0: %v, %v %v", err, o.Redis.Timeout, o.Drain)
	}
}
