package postgres

import bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"

// clock is the Store's time source for its circuit breaker and the timers
// of its background loops (the health probe, the connect loop's retries
// and the sweeper), so that a test that moves it moves all of them.
// Production uses bclock.System. Budgets (caller deadlines, Timeout)
// stay on the real clock; decisions use the server's.
type clock = bclock.Clock
