package xds

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	c := &client{o: Options{BackoffInitial: time.Second, BackoffMax: 5 * time.Second, DisableBackoffJitter: true}}
	for n, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if got := c.backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
	c.o.DisableBackoffJitter, c.o.BackoffRandomFactor = false, 0.5
	for n := 0; n < 200; n++ {
		base := min(time.Second<<min(n%4, 3), 5*time.Second)
		if got := c.backoff(n % 4); got < base/2 || got > base*3/2 {
			t.Fatalf("backoff(%d) with ±50%% jitter = %v, want within [%v, %v]", n%4, got, base/2, base*3/2)
		}
	}
	if got := jitter(time.Second, 0); got != time.Second {
		t.Errorf("jitter factor 0 = %v", got)
	}
	if got := jitter(time.Second, 7); got < 0 || got > 2*time.Second {
		t.Errorf("jitter factor clamped to 1: %v", got)
	}
}

func TestTruncate(t *testing.T) {
	if got := truncate("abc", 5); got != "abc" {
		t.Errorf("short: %q", got)
	}
	got := truncate("aé"+"xxxx", 2) // cut inside é
	if got != "a… (6 more bytes)" {
		t.Errorf("rune boundary: %q", got)
	}
}

func TestUnreachable(t *testing.T) {
	if !unreachable("dial tcp 127.0.0.1:1: connect: connection refused") || unreachable("remote error: tls: certificate required") {
		t.Error("unreachable misclassifies")
	}
}

// The zero Options spread the waits by DefaultBackoffRandomFactor, as
// envoyproxy/ratelimit does; NoBackoffSpread is the only valid factor
// outside [0, 1], and it, like DisableBackoffJitter, keeps waits exact.
func TestBackoffZeroValues(t *testing.T) {
	var o Options
	o.defaults()
	if o.BackoffRandomFactor != DefaultBackoffRandomFactor || o.DisableBackoffJitter {
		t.Errorf("zero Options: factor %v, jitter disabled %v; want %v, false", o.BackoffRandomFactor, o.DisableBackoffJitter, DefaultBackoffRandomFactor)
	}
	for _, f := range []float64{0, NoBackoffSpread, 0.25, 1} {
		if err := (Options{BackoffRandomFactor: f}).Validate(); err != nil {
			t.Errorf("BackoffRandomFactor %v: %v", f, err)
		}
	}
	for _, f := range []float64{-0.5, 1.5} {
		if err := (Options{BackoffRandomFactor: f}).Validate(); err == nil {
			t.Errorf("BackoffRandomFactor %v accepted", f)
		}
	}
	c := &client{o: Options{BackoffInitial: time.Second, BackoffMax: time.Second, BackoffRandomFactor: NoBackoffSpread}}
	if got := c.backoff(0); got != time.Second {
		t.Errorf("backoff with NoBackoffSpread = %v, want 1s", got)
	}
}
