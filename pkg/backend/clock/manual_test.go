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

// TestManualFire: Fire with no timer armed reports false and leaves the
// time; with timers armed it fires the one due first, moves the time to
// its deadline and returns without waiting for a timer to be armed again.
func TestManualFire(t *testing.T) {
	c := clock.NewManual()
	before := c.Now()
	if c.Fire() {
		t.Fatal("Fire reported a timer fired with none armed")
	}
	if got := c.Now().Sub(before); got >= time.Minute {
		t.Fatalf("Fire with no timer armed moved the time by %v", got)
	}
	late, early := c.NewTimer(time.Hour), c.NewTimer(time.Minute)
	if !c.Fire() {
		t.Fatal("Fire reported no timer armed with two armed")
	}
	select {
	case at := <-early.C():
		if at.Sub(before) < time.Minute {
			t.Fatalf("the timer armed for 1m fired %v after it was armed", at.Sub(before))
		}
	default:
		t.Fatal("Fire did not fire the timer due first")
	}
	select {
	case <-late.C():
		t.Fatal("Fire fired the timer due later too")
	default:
	}
	if c.Now().Sub(before) >= time.Hour {
		t.Fatalf("Fire moved the time %v on, past the later timer's deadline", c.Now().Sub(before))
	}
	if !c.Fire() {
		t.Fatal("the timer due later was not left armed")
	}
	<-late.C()
	if c.Fire() {
		t.Fatal("Fire fired a timer that had fired already")
	}
}

// TestManualFreeze: a frozen Manual stands still while real time passes,
// and moves only by Advance and Fire; Next tells the deadline Fire moves
// it to.
func TestManualFreeze(t *testing.T) {
	c := clock.NewManual()
	c.Freeze()
	at := c.Now()
	deadline := time.Now().Add(10 * time.Second)
	for real := time.Now(); time.Since(real) < time.Millisecond; { // real time passes
		if time.Now().After(deadline) {
			t.Fatal("the real clock did not move")
		}
	}
	if got := c.Now(); !got.Equal(at) {
		t.Fatalf("a frozen clock moved %v with real time", got.Sub(at))
	}
	c.Advance(time.Second)
	if got := c.Now().Sub(at); got != time.Second {
		t.Fatalf("Advance(1s) moved a frozen clock %v", got)
	}
	if _, ok := c.Next(); ok {
		t.Fatal("Next reported a timer with none armed")
	}
	tm := c.NewTimer(time.Minute)
	next, ok := c.Next()
	if !ok || next.Sub(at) != time.Second+time.Minute {
		t.Fatalf("Next = %v, %v; want the timer's deadline, 1m after the time it was armed", next.Sub(at), ok)
	}
	c.Fire()
	<-tm.C()
	if got := c.Now(); !got.Equal(next) {
		t.Fatalf("Fire moved a frozen clock to %v, want the timer's deadline %v", got.Sub(at), next.Sub(at))
	}
}
