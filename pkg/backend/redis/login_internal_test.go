package redis

import (
	"errors"
	"testing"
	"time"
)

// TestLoginGateBackoff: after a refused login the gate lets one dial
// through per backoff, 1 s doubling to 30 s, whether or not a call
// reports the refusal of that dial, and a login that succeeds frees
// dials at once. Driven by a clock the test moves: 100 s in steps of
// 100 ms, asking to dial at every step.
func TestLoginGateBackoff(t *testing.T) {
	for _, reported := range []bool{false, true} {
		now := time.Unix(0, 0)
		g := &loginGate{now: func() time.Time { return now }}
		if err := g.dial(); err != nil {
			t.Fatalf("dial before any refusal: %v", err)
		}
		g.refused()
		var trials []time.Duration
		for step := time.Duration(0); step <= 100*time.Second; step += 100 * time.Millisecond {
			now = time.Unix(0, 0).Add(step)
			switch err := g.dial(); {
			case err == nil:
				trials = append(trials, step)
				if reported {
					g.refused()
					g.refused() // several calls report the one dial's refusal
				}
			case !errors.Is(err, ErrLoginBackoff):
				t.Fatalf("dial at %v: %v", step, err)
			}
		}
		// Reported, the refusal doubles the backoff from its dial;
		// unreported, the next dial does, from itself.
		want := []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 62 * time.Second, 92 * time.Second}
		if reported {
			want = []time.Duration{1 * time.Second, 3 * time.Second, 7 * time.Second, 15 * time.Second, 31 * time.Second, 61 * time.Second, 91 * time.Second}
		}
		if len(trials) != len(want) {
			t.Fatalf("reported %v: dials let through at %v, want %v", reported, trials, want)
		}
		for i := range want {
			if trials[i] != want[i] {
				t.Fatalf("reported %v: dials let through at %v, want %v", reported, trials, want)
			}
		}
		g.loggedIn()
		for range 3 {
			if err := g.dial(); err != nil {
				t.Fatalf("dial after a login succeeded: %v", err)
			}
		}
	}
}
