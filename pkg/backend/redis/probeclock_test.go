package redis

import bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"

// NewOnClock is New with c as the Store's clock: its circuit breakers,
// health probe loop (Options.HealthInterval), batchers and liveness.
func NewOnClock(o Options, c *bclock.Manual) (*Store, error) { return newWithClock(o, c) }

// RecoveryPoll is the probe's period while the Store is not healthy.
const RecoveryPoll = recoveryPoll

// ProbeRunning reports whether s has a health probe loop.
func ProbeRunning(s *Store) bool { return s.health != nil }

// BreakerOpened is how many times the circuit of s's master (standalone,
// Sentinel) has opened.
func BreakerOpened(s *Store) uint64 { return s.breaker.Opened() }

// FcallOn reports whether lone window decisions on s's standalone or
// Sentinel master go out as FCALL.
func FcallOn(s *Store) bool { return s.def.fn.fcall() }

// CaptureLog routes the Store's own log lines (not go-redis') to l until
// the returned func is called.
func CaptureLog(l Logger) (restore func()) {
	prev := logger.Swap(&l)
	return func() { logger.Store(prev) }
}

// FunctionsReloading reports whether the health probe's load of the
// function library (reloadFunctions) is running.
func FunctionsReloading(s *Store) bool { return s.fnReloading.Load() }
