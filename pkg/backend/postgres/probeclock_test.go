package postgres

import (
	"context"

	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

// NewOnClock is New with c as the Store's clock: its circuit breaker and
// the timers of its health probe (Options.HealthInterval), its connect
// loop and its sweeper (Options.SweepInterval).
func NewOnClock(ctx context.Context, o Options, c *bclock.Manual) (*Store, error) {
	return newWithClock(ctx, o, c)
}
