package redis

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ManualClock is a probeClock that a test advances by hand: the health
// probe's loop runs one iteration per Tick, whatever the speed of the
// host. Its one timer is the loop's.
type ManualClock struct {
	base   time.Time
	off    atomic.Int64 // the time now, in ns since base
	mu     sync.Mutex
	at     time.Time     // when the armed timer fires
	armed  time.Duration // the duration it was last armed with
	gen    int           // times armed (NewTimer, Reset)
	seen   int           // gen that Tick last saw
	notify chan struct{} // a non-blocking signal: armed again
	c      chan time.Time
}

// NewManualClock starts at an arbitrary fixed time.
func NewManualClock() *ManualClock {
	return &ManualClock{
		base:   time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		notify: make(chan struct{}, 1),
		c:      make(chan time.Time, 1),
	}
}

// Now is the manual time.
func (m *ManualClock) Now() time.Time { return m.base.Add(time.Duration(m.off.Load())) }

// Advance moves the time on by d without firing the timer.
func (m *ManualClock) Advance(d time.Duration) { m.off.Add(int64(d)) }

// NewTimer arms the clock's timer.
func (m *ManualClock) NewTimer(d time.Duration) probeTimer {
	m.arm(d)
	return manualTimer{m}
}

func (m *ManualClock) arm(d time.Duration) {
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
// Redis, each bounded by the probe's timeout) until the loop has armed its
// timer since Tick last looked, and returns the duration.
func (m *ManualClock) waitArmed(t testing.TB) time.Duration {
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
func (m *ManualClock) Tick(t testing.TB) time.Duration {
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
	if at.After(m.Now()) {
		m.off.Store(int64(at.Sub(m.base))) // only Tick and Advance move it: the test's goroutine
	}
	m.c <- m.Now()
	return m.waitArmed(t)
}

type manualTimer struct{ m *ManualClock }

func (t manualTimer) C() <-chan time.Time        { return t.m.c }
func (t manualTimer) Reset(d time.Duration) bool { t.m.arm(d); return true }
func (t manualTimer) Stop() bool                 { return true }

// StartProbe starts s's health probe loop with period interval on clock
// c; s must have been created with HealthInterval 0 (no loop of its own).
// The loop stops with s.Close.
func StartProbe(s *Store, interval time.Duration, c *ManualClock) {
	s.startHealthClock(interval, c)
}

// RecoveryPoll is the probe's period while the Store is not healthy.
const RecoveryPoll = recoveryPoll

// ProbeRunning reports whether s has a health probe loop.
func ProbeRunning(s *Store) bool { return s.health != nil }

// BreakerOpened is how many times the circuit of s's master (standalone,
// Sentinel) has opened.
func BreakerOpened(s *Store) uint64 { return s.breaker.Opened() }
