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

// Manual is a Clock that a test moves on by hand: a store's health probe
// loop runs exactly one iteration per Tick, and the store's breakers (and
// what else reads the clock) see the time Tick and Advance move to. It
// runs on with real time as well, so that what a real server takes (a
// call that times out, a socket left unanswered) counts as it does in
// production. Its one timer is the probe loop's.
type Manual struct {
	off    atomic.Int64 // how far ahead of the real time it is, in ns
	mu     sync.Mutex
	at     time.Time     // when the armed timer fires
	armed  time.Duration // the duration it was last armed with
	gen    int           // times armed (NewTimer, Reset)
	seen   int           // gen that Tick last saw
	notify chan struct{} // a non-blocking signal: armed again
	c      chan time.Time
}

// NewManual starts at the real time.
func NewManual() *Manual {
	return &Manual{
		notify: make(chan struct{}, 1),
		c:      make(chan time.Time, 1),
	}
}

// Now is the real time moved on by Tick and Advance.
func (m *Manual) Now() time.Time { return time.Now().Add(time.Duration(m.off.Load())) }

// Advance moves the time on by d without firing the timer.
func (m *Manual) Advance(d time.Duration) { m.off.Add(int64(d)) }

// NewTimer arms the clock's timer.
func (m *Manual) NewTimer(d time.Duration) Timer {
	m.arm(d)
	return manualTimer{m}
}

func (m *Manual) arm(d time.Duration) {
	m.mu.Lock()
	m.at, m.armed = m.Now().Add(d), d
	m.gen++
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// waitArmed waits (up to 20 s: the loop's iteration includes real calls to
// the server, each bounded by the probe's timeout) until the loop has
// armed its timer since Tick last looked, and returns the duration.
func (m *Manual) waitArmed(t TB) time.Duration {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		m.mu.Lock()
		if m.gen > m.seen {
			m.seen = m.gen
			d := m.armed
			m.mu.Unlock()
			return d
		}
		m.mu.Unlock()
		select {
		case <-m.notify:
		case <-deadline.C:
			t.Fatal("the health probe loop did not arm its timer within 20 s")
		}
	}
}

// Tick runs one iteration of the probe loop: it waits until the loop is
// waiting on its timer, moves the time to the timer's deadline, fires it
// and waits until the loop has armed the timer again. It returns the
// duration the loop armed it with (its next period).
func (m *Manual) Tick(t TB) time.Duration {
	t.Helper()
	m.mu.Lock()
	fresh := m.gen > m.seen || m.seen == 0
	m.mu.Unlock()
	if fresh {
		m.waitArmed(t)
	}
	m.mu.Lock()
	at := m.at
	m.mu.Unlock()
	if ahead := at.Sub(m.Now()); ahead > 0 {
		m.off.Add(int64(ahead)) // only Tick and Advance move it: the test's goroutine
	}
	m.c <- m.Now()
	return m.waitArmed(t)
}

type manualTimer struct{ m *Manual }

func (t manualTimer) C() <-chan time.Time        { return t.m.c }
func (t manualTimer) Reset(d time.Duration) bool { t.m.arm(d); return true }
func (t manualTimer) Stop() bool                 { return true }
