package memcache

import (
	"errors"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
)

// The Store's circuit breaker (pkg/backend/breaker, the Redis backend's)
// guards a Store of one memcached server: every decision goes through it,
// so that a frozen or black-holed memcached costs requests their budget
// only until the circuit opens (about FailFor, 1 s, after it stopped
// answering; refused connections open it after Failures of them in a
// row). Only decisions open it; the health probe goes through it only
// while it is not closed, as a half-open probe that closes it, so an idle
// Store recovers too, and Healthy is false while it is not closed.
//
// With several servers the breaker stays out of the way: each key lives on
// one server, and one circuit for all of them would give the decisions of
// the healthy servers' keys their failure modes (failure_mode open: admitted
// uncounted) whenever one server failed. There a dead server costs only
// the decisions on its keys (refused at once), a frozen one their budget.

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
