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

// TestManualTickNewTimerEachIteration is the loop of the memcached
// store: a new timer per iteration, never Reset.
func TestManualTickNewTimerEachIteration(t *testing.T) {
	c := clock.NewManual()
	type firing struct{ d, waited time.Duration }
	fired := make(chan firing, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for d := time.Second; ; d *= 2 {
			armed := c.Now()
			tm := c.NewTimer(d)
			select {
			case <-done:
				return
			case at := <-tm.C():
				fired <- firing{d, at.Sub(armed)}
			}
		}
	}()
	for i, d := 0, time.Second; i < 5; i, d = i+1, d*2 {
		if next := c.Tick(t); next != 2*d {
			t.Fatalf("Tick %d returned %v, want %v", i, next, 2*d)
		}
		got := <-fired
		if got.d != d {
			t.Fatalf("Tick %d fired the timer armed with %v, want %v", i, got.d, d)
		}
		if got.waited < d {
			t.Fatalf("Tick %d fired the timer %v after it was armed, want at least %v", i, got.waited, d)
		}
	}
}

// TestManualTickFiresTheTimerDueFirst: with several loops on one clock
// (a store's probe and its sweeper), each Tick fires the timer due first,
// the others stay armed, and a stopped timer never fires.
func TestManualTickFiresTheTimerDueFirst(t *testing.T) {
	c := clock.NewManual()
	done := make(chan struct{})
	defer close(done)
	loop := func(tm clock.Timer, d time.Duration, fired chan<- struct{}) {
		for {
			select {
			case <-done:
				return
			case <-tm.C():
				fired <- struct{}{}
				tm.Reset(d)
			}
		}
	}
	start := c.Now()
	fast, slow := make(chan struct{}, 1), make(chan struct{}, 1)
	go loop(c.NewTimer(time.Second), time.Second, fast)
	go loop(c.NewTimer(10*time.Second), 10*time.Second, slow)
	stopped := c.NewTimer(time.Millisecond)
	if !stopped.Stop() {
		t.Fatal("Stop reported an armed timer as not armed")
	}
	var nfast, nslow int
	for range 22 {
		c.Tick(t)
		select {
		case <-fast:
			nfast++
		case <-slow:
			nslow++
		}
	}
	if nfast != 20 || nslow != 2 {
		t.Fatalf("22 Ticks fired the 1 s timer %d times and the 10 s one %d times, want 20 and 2", nfast, nslow)
	}
	if moved := c.Now().Sub(start); moved < 20*time.Second || moved > 21*time.Second {
		t.Fatalf("22 Ticks moved the clock on by %v, want 20 s and less than 21 s", moved)
	}
	select {
	case <-stopped.C():
		t.Fatal("a stopped timer fired")
	default:
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
