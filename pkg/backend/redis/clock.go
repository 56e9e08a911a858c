package redis

import "time"

// clock is the Store's one time source: its circuit breakers, its health
// probe, its batchers' budgets and stall detection (liveness) all read
// it, so that a test that moves it moves all of them together. Production
// uses systemClock; tests pass one they advance by hand. Socket deadlines
// and the server's clock (window keys) stay on the real clock.
type clock interface {
	Now() time.Time
	// NewTimer is the health probe loop's timer (the one timer the
	// clock drives).
	NewTimer(d time.Duration) probeTimer
}

// probeTimer is the part of *time.Timer the probe loop uses.
type probeTimer interface {
	C() <-chan time.Time
	Reset(d time.Duration) bool
	Stop() bool
}

// systemClock is time.Now and time.NewTimer.
type systemClock struct{}

func (systemClock) Now() time.Time                      { return time.Now() }
func (systemClock) NewTimer(d time.Duration) probeTimer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time        { return t.t.C }
func (t systemTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
func (t systemTimer) Stop() bool                 { return t.t.Stop() }
