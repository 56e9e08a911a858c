package redis

import bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"

// clock is the Store's one time source: its circuit breakers, its health
// probe, its batchers' budgets and stall detection (liveness) all read
// it, so that a test that moves it moves all of them together. Production
// uses bclock.System; tests pass a bclock.Manual. Socket deadlines and
// the server's clock (window keys) stay on the real clock.
type clock = bclock.Clock
