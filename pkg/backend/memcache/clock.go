package memcache

import bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"

// clock is the Store's time source for its circuit breaker and its health
// probe's timer, so that a test that moves it moves both. Production uses
// bclock.System. Budgets (socket and caller deadlines) and the SRV refresh
// stay on the real clock, and Options.Now places hits in windows.
type clock = bclock.Clock
