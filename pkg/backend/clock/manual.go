package clock

import (
	"sync"
	"sync/atomic"
	"time"
)

// TB is the part of testing.TB that Manual uses; the package does not
// import testing so that the stores do not link it.
type TB interface {
	// Helper marks the caller as a test helper.
	Helper()
	// Fatal fails the test and stops its goroutine.
	Fatal(args ...any)
}

// Manual is a Clock that a test moves on by hand: each Tick fires the
// armed timer that is due first and runs one iteration of the loop that
// waits on it (a health probe, a connect loop's retry, a sweeper),
// whatever the speed of the host; the store's breakers (and what else
// reads the clock) see the time Tick and Advance move to. It runs on
// with real time as well, so that what a real server takes (a call that
// times out, a socket left unanswered) counts as it does in production.
// Only Tick fires a timer.
type Manual struct {
	off    atomic.Int64 // how far ahead of the real time it is, in ns
	frozen atomic.Int64 // the real time Freeze stopped it at (Unix ns), or 0
	mu     sync.Mutex
	timers map[*manualTimer]struct{} // armed: made or Reset, not fired nor stopped
	armed  time.Duration             // the duration a timer was last armed with
	gen    int                       // times a timer was armed (NewTimer, Reset)
	notify chan struct{}             // a non-blocking signal: a timer was armed
}

// NewManual starts at the real time.
func NewManual() *Manual {
	return &Manual{
		timers: make(map[*manualTimer]struct{}),
		notify: make(chan struct{}, 1),
	}
}

// Now is the real time moved on by Tick, Fire and Advance (after Freeze,
// the time Freeze stopped at, moved on by them).
func (m *Manual) Now() time.Time {
	base := time.Now()
	if f := m.frozen.Load(); f != 0 {
		base = time.Unix(0, f)
	}
	return base.Add(time.Duration(m.off.Load()))
}

// Freeze stops the clock running on with real time: from then on only
// Tick, Fire and Advance move it. A test whose loop compares instants a
// few milliseconds apart (a config watcher's samples) freezes it, so that
// a loaded host's scheduling does not count as time passed.
func (m *Manual) Freeze() { m.frozen.CompareAndSwap(0, time.Now().UnixNano()) }

// Next is the deadline of the armed timer due first; ok is false when no
// timer is armed.
func (m *Manual) Next() (at time.Time, ok bool) {
	tm, _ := m.next()
	if tm == nil {
		return time.Time{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return tm.at, true
}

// Advance moves the time on by d without firing any timer.
func (m *Manual) Advance(d time.Duration) { m.off.Add(int64(d)) }

// NewTimer arms a timer of the clock.
func (m *Manual) NewTimer(d time.Duration) Timer {
	t := &manualTimer{m: m, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// manualTimer is one of a Manual's timers; at is guarded by m.mu.
type manualTimer struct {
	m  *Manual
	at time.Time
	c  chan time.Time
}

func (t *manualTimer) C() <-chan time.Time { return t.c }

// Reset arms t to fire d after Now, dropping a time it sent but was not
// received (as time.Timer.Reset does).
func (t *manualTimer) Reset(d time.Duration) bool {
	m := t.m
	m.mu.Lock()
	_, was := m.timers[t]
	t.drain()
	t.at = m.Now().Add(d)
	m.timers[t] = struct{}{}
	m.armed = d
	m.gen++
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
	return was
}

// Stop disarms t; it reports whether t was armed.
func (t *manualTimer) Stop() bool {
	m := t.m
	m.mu.Lock()
	defer m.mu.Unlock()
	_, was := m.timers[t]
	delete(m.timers, t)
	t.drain()
	return was
}

func (t *manualTimer) drain() {
	select {
	case <-t.c:
	default:
	}
}

// waitArmed waits (up to 20 s: a loop's iteration includes real calls to
// the server, each bounded by a timeout) until a timer is armed after the
// gen'th arming and returns the duration it was armed with.
func (m *Manual) waitArmed(t TB, gen int) time.Duration {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		m.mu.Lock()
		if m.gen > gen {
			d := m.armed
			m.mu.Unlock()
			return d
		}
		m.mu.Unlock()
		select {
		case <-m.notify:
		case <-deadline.C:
			t.Fatal("no loop armed a timer of the clock within 20 s")
		}
	}
}

// next is the armed timer due first, or nil, and the arming count.
func (m *Manual) next() (*manualTimer, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var first *manualTimer
	for tm := range m.timers {
		if first == nil || tm.at.Before(first.at) {
			first = tm
		}
	}
	return first, m.gen
}

// Tick runs one iteration of a loop: it waits until a timer is armed,
// moves the time to the deadline of the one due first, fires it and waits
// until a timer is armed again (the loop's next wait). It returns the
// duration that timer was armed with (the loop's next period).
func (m *Manual) Tick(t TB) time.Duration {
	t.Helper()
	tm, gen := m.next()
	for tm == nil { // a loop between two waits; it may stop what it armed
		m.waitArmed(t, gen)
		tm, gen = m.next()
	}
	m.fire(tm)
	return m.waitArmed(t, gen)
}

// fire disarms tm, moves the time to its deadline and sends on its
// channel (empty: a timer fires once per arming, and Reset drains it).
func (m *Manual) fire(tm *manualTimer) {
	m.mu.Lock()
	delete(m.timers, tm)
	at := tm.at
	m.mu.Unlock()
	if ahead := at.Sub(m.Now()); ahead > 0 {
		m.off.Add(int64(ahead)) // only Tick, Fire and Advance move it: the test's goroutine
	}
	tm.c <- m.Now()
}

// Fire moves the time to the deadline of the armed timer due first and
// fires it, without waiting for a timer to be armed again: for a loop that
// may go idle after it (a config watcher whose burst ends), whose test
// learns by its own means when the loop is done. It reports false, and
// moves nothing, when no timer is armed.
func (m *Manual) Fire() bool {
	tm, _ := m.next()
	if tm == nil {
		return false
	}
	m.fire(tm)
	return true
}
