package memcache

import (
	"errors"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
)

// The Store's circuit breaker (pkg/backend/breaker) guards a Store of one
// memcached server, so that a frozen or black-holed memcached costs
// requests their budget only until the circuit opens (FailFor after it
// stopped answering, or Failures refused connections in a row). Only
// decisions open it; the health probe is its half-open probe, so an idle
// Store recovers too. With several servers the breaker is bypassed
// (guarded): one circuit for all would send the healthy servers' keys to
// their failure modes whenever one server failed.

// breakerErrors are memcached's errors of the Store's breaker.
var breakerErrors = breaker.Errors{Open: ErrCircuitOpen, StalledOpen: ErrStalledOpen, Outcome: breakerOutcome}

// breakerOptions are breaker.DefaultOptions with FailFor raised to at
// least 2 × opts.Timeout, so that a stall of 3 timeouts never opens the
// circuit (as the Redis backend raises it), opts.OnCircuit as
// OnTransition and opts.OnCircuitReport as OnReport.
func breakerOptions(opts Options) breaker.Options {
	b := breaker.DefaultOptions()
	b.FailFor = max(b.FailFor, 2*opts.Timeout)
	b.OnTransition = opts.OnCircuit
	b.OnReport = opts.OnCircuitReport
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
	neutral := e.Cause() == CauseCanceled || e.Cause() == CauseCircuitOpen || (e.Cause() == CauseTimeout && !e.Outage())
	return breaker.OutcomeOf(e.Outage(), e.Cause() == CauseTimeout, neutral)
}

// guarded reports whether the breaker guards the decisions: the server
// list holds exactly one server.
func (s *Store) guarded() bool { return s.nservers.Load() == 1 }

// BreakerState is the circuit breaker's state now: "closed", "open" or
// "half_open" (the label of ratelimitd_backend_circuit_state); "closed"
// while it does not guard the decisions (several servers).
func (s *Store) BreakerState() string {
	if !s.guarded() {
		return breaker.Closed.String()
	}
	return s.breaker.State().String()
}
