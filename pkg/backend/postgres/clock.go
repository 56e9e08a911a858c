package postgres

import bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"

// clock is the Store's time source for its circuit breaker and its health
// probe's timer, so that a test that moves it moves both. Production uses
// bclock.System. Budgets (caller deadlines, Timeout), the connect loop and
// the sweeper stay on the real clock; decisions use the server's.
type clock = bclock.Clock
