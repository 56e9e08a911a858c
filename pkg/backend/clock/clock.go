// Package clock is the time source of the Redis, memcached and PostgreSQL
// stores: what their circuit breakers read and their background loops
// (health probes, PostgreSQL's connect loop and sweeper) wait on, so that
// a test that moves it moves all of them together. Production uses
// System; tests use Manual, which they move on by hand. The RLQS server
// takes a Clock too, and the config watcher a policy.Clock, which a
// Manual is (Timer is the same type in both packages).
package clock

import "time"

// A Clock tells the time and makes timers.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// NewTimer makes the timer a background loop (a health probe, a
	// connect loop, a sweeper) waits on.
	NewTimer(d time.Duration) Timer
}

// A Timer is the part of *time.Timer a store's background loop uses. It
// is an interface literal, not a defined type, so that a package that may
// not import this one (pkg/policy, for its config watcher) can spell the
// same type and take a Manual as its clock.
type Timer = interface {
	// C is the channel the timer sends the time on when it fires.
	C() <-chan time.Time
	// Reset arms the timer again to fire after d, as time.Timer.Reset.
	Reset(d time.Duration) bool
	// Stop keeps the timer from firing, as time.Timer.Stop.
	Stop() bool
}

// System is time.Now and time.NewTimer.
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }

// NewTimer returns time.NewTimer(d).
func (System) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time        { return t.t.C }
func (t systemTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
func (t systemTimer) Stop() bool                 { return t.t.Stop() }
