package memcache

import (
	"errors"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
)

// The Store's circuit breaker (pkg/backend/breaker, the Redis backend's):
// every decision that would reach memcached goes through it, so that a
// frozen or black-holed memcached costs requests their budget only until
// the circuit opens (about FailFor, 1 s, after it stopped answering;
// refused connections open it after Failures of them in a row). Only
// decisions open it; the health probe goes through it only while it is
// not closed, as a half-open probe that closes it, so an idle Store
// recovers too, and Healthy is false while it is not closed. One
// breaker guards all the servers: with several, decisions on the healthy
// ones keep it closed unless at least FailureRatio of them fail.

// breakerErrors are memcached's errors of the Store's breaker.
var breakerErrors = breaker.Errors{Open: ErrCircuitOpen, StalledOpen: ErrStalledOpen, Outcome: breakerOutcome}

// breakerOptions are breaker.DefaultOptions with FailFor raised to at
// least 2 × opts.Timeout, so that a stall of 3 timeouts never opens the
// circuit (as the Redis backend raises it).
func breakerOptions(opts Options) breaker.Options {
	b := breaker.DefaultOptions()
	b.FailFor = max(b.FailFor, 2*opts.Timeout)
	return b
}

// breakerOutcome classifies err (Classify) for the breaker: timeouts that
// prove no silence of memcached (a budget cut short by the caller's
// deadline, a caller gone, a refusal of the breaker), cancellations and
// the breaker's refusals are Neutral; outage errors are Stalled when they
// are timeouts and Failed otherwise (refused: no usable connection);
// anything else is a reply from a live server (Answered).
func breakerOutcome(err error) breaker.Outcome {
	var e *Error
	errors.As(Classify(err), &e) // always true for err != nil
	neutral := e.cause == CauseCanceled || e.cause == CauseCircuitOpen || (e.cause == CauseTimeout && !e.outage)
	return breaker.OutcomeOf(e.outage, e.cause == CauseTimeout, neutral)
}

// BreakerState is the circuit breaker's state now: "closed", "open" or
// "half_open" (the label of ratelimitd_backend_circuit_state).
func (s *Store) BreakerState() string { return s.breaker.State().String() }
