package memcache

import bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"

// NewOnClock is New with c as the Store's clock: its circuit breaker and
// health probe loop (Options.HealthInterval).
func NewOnClock(o Options, c *bclock.Manual) (*Store, error) { return newWithClock(o, c) }
