package clock_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

// probeLoop is a health probe loop on c the way the Redis store runs one:
// one timer, Reset each time with the next period from periods. Each time
// the timer fires it sends the time it read to fired.
func probeLoop(c clock.Clock, periods []time.Duration, fired chan<- time.Time, done <-chan struct{}) {
	t := c.NewTimer(periods[0])
	defer t.Stop()
	for i := 1; ; i++ {
		select {
		case <-done:
			return
		case at := <-t.C():
			fired <- at
			t.Reset(periods[i%len(periods)])
		}
	}
}

func TestManualAdvanceMovesNowWithoutFiring(t *testing.T) {
	c := clock.NewManual()
	tm := c.NewTimer(time.Minute)
	before := time.Now()
	c.Advance(time.Hour)
	if got := c.Now().Sub(before); got < time.Hour {
		t.Fatalf("Now after Advance(1h) is %v past the real time before it, want at least 1h", got)
	}
	select {
	case at := <-tm.C():
		t.Fatalf("Advance fired the timer (at %v); only Tick fires it", at)
	default:
	}
	c.Advance(time.Hour)
	if got := c.Now().Sub(before); got < 2*time.Hour {
		t.Fatalf("Now after two Advance(1h) is %v past the real time, want at least 2h", got)
	}
}

func TestManualTickRunsOneIteration(t *testing.T) {
	c := clock.NewManual()
	periods := []time.Duration{10 * time.Minute, time.Minute, 3 * time.Hour}
	fired := make(chan time.Time, 1)
	done := make(chan struct{})
	defer close(done)
	prev := c.Now() // the loop arms each period after the time it last fired with
	go probeLoop(c, periods, fired, done)

	for i := 1; i <= 7; i++ {
		armed := periods[(i-1)%len(periods)] // the period the loop is waiting on
		next := c.Tick(t)
		if want := periods[i%len(periods)]; next != want {
			t.Fatalf("Tick %d returned %v, want the loop's next period %v", i, next, want)
		}
		at := <-fired
		if at.Sub(prev) < armed {
			t.Fatalf("Tick %d fired the timer %v after it last fired, want at least the armed %v", i, at.Sub(prev), armed)
		}
		prev = at
		if now := c.Now(); now.Before(at) {
			t.Fatalf("Tick %d: Now %v is before the time the timer fired with %v", i, now, at)
		}
		select {
		case at := <-fired:
			t.Fatalf("Tick %d fired the timer twice (again at %v)", i, at)
		default:
		}
	}
}

// TestManualTickNewTimerEachIteration is the loop of the memcached and
// PostgreSQL stores: a new timer per iteration, never Reset.
func TestManualTickNewTimerEachIteration(t *testing.T) {
	c := clock.NewManual()
	fired := make(chan time.Duration, 1)
	done := make(chan struct{})
	defer close(done)
	prev := c.Now()
	go func() {
		for d := time.Second; ; d *= 2 {
			tm := c.NewTimer(d)
			select {
			case <-done:
				return
			case <-tm.C():
				fired <- d
			}
		}
	}()
	for i, d := 0, time.Second; i < 5; i, d = i+1, d*2 {
		if next := c.Tick(t); next != 2*d {
			t.Fatalf("Tick %d returned %v, want %v", i, next, 2*d)
		}
		if got := <-fired; got != d {
			t.Fatalf("Tick %d fired the timer armed with %v, want %v", i, got, d)
		}
		now := c.Now()
		if moved := now.Sub(prev); moved < d {
			t.Fatalf("Tick %d moved the clock on by %v, want at least %v", i, moved, d)
		}
		prev = now
	}
}

func TestSystemTimerFires(t *testing.T) {
	var c clock.Clock = clock.System{}
	before := time.Now()
	tm := c.NewTimer(time.Millisecond)
	at := <-tm.C()
	if at.Before(before) {
		t.Fatalf("the System timer fired at %v, before it was made (%v)", at, before)
	}
	if tm.Stop() {
		t.Fatal("Stop reported a fired timer as still running")
	}
	if c.Now().Before(before) {
		t.Fatal("System.Now went back")
	}
}
