package postgres

import (
	"context"

	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

// NewOnClock is New with c as the Store's clock: its circuit breaker and
// health probe loop (Options.HealthInterval).
func NewOnClock(ctx context.Context, o Options, c *bclock.Manual) (*Store, error) {
	return newWithClock(ctx, o, c)
}
