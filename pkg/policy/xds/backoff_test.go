package xds

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	c := &client{o: Options{BackoffInitial: time.Second, BackoffMax: 5 * time.Second}}
	for n, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if got := c.backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
	c.o.BackoffJitter, c.o.BackoffRandomFactor = true, 0.5
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
