package memcache

import "time"

// clock is the Store's time source for its circuit breaker and its health
// probe's timer, so that a test that moves it moves both. Production uses
// systemClock. Budgets (socket and caller deadlines) and the SRV refresh
// stay on the real clock, and Options.Now places hits in windows.
type clock interface {
	Now() time.Time
	// NewTimer is the health probe loop's timer.
	NewTimer(d time.Duration) probeTimer
}

// probeTimer is the part of *time.Timer the probe loop uses.
type probeTimer interface {
	C() <-chan time.Time
	Stop() bool
}

// systemClock is time.Now and time.NewTimer.
type systemClock struct{}

func (systemClock) Now() time.Time                      { return time.Now() }
func (systemClock) NewTimer(d time.Duration) probeTimer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }
