package redis

import (
	"context"
	"errors"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
)

// The Redis Store's circuit breaker is pkg/backend/breaker (which says why
// it is not a library's) with Redis' errors: this file names its types in
// the terms of this package and classifies Redis errors for it.

// BreakerState is the state of a circuit breaker (breaker.State).
type BreakerState = breaker.State

// The breaker's states.
const (
	// BreakerClosed: calls go to Redis.
	BreakerClosed = breaker.Closed
	// BreakerOpen: calls fail immediately with ErrCircuitOpen or
	// ErrStalledOpen.
	BreakerOpen = breaker.Open
	// BreakerHalfOpen: OpenFor has passed; up to Probes probe calls at a
	// time go to Redis (see breaker.HalfOpen).
	BreakerHalfOpen = breaker.HalfOpen
)

// BreakerReport is one report of an outage for the log
// (breaker.Report, see BreakerOptions.OnReport).
type BreakerReport = breaker.Report

// Defaults of DefaultBreakerOptions (breaker.Default*).
const (
	DefaultBreakerFailures     = breaker.DefaultFailures
	DefaultBreakerWindow       = breaker.DefaultWindow
	DefaultBreakerMinCalls     = breaker.DefaultMinCalls
	DefaultBreakerFailureRatio = breaker.DefaultFailureRatio
	DefaultBreakerOpenFor      = breaker.DefaultOpenFor
	DefaultBreakerFailFor      = breaker.DefaultFailFor
	DefaultBreakerProbes       = breaker.DefaultProbes
	DefaultBreakerReportEvery  = breaker.DefaultReportEvery
)

// BreakerOptions configure the Store's Breaker (breaker.Options). Only
// outage errors (Error.Outage: timeout, refused, reset, loading, clusterdown,
// unknown connection errors) count as failures; replies from a live server
// (OOM, READONLY, auth, script errors), caller cancellations and deadlines
// (CauseDeadline) do not.
type BreakerOptions = breaker.Options

// DefaultBreakerOptions are breaker.DefaultOptions: open after 5
// consecutive failures or >= 50% failed of >= 20 calls within 1 s,
// timeouts only once they have lasted 1 s; up to 3 probes after 250 ms.
func DefaultBreakerOptions() BreakerOptions { return breaker.DefaultOptions() }

// Breaker is a breaker.Breaker that refuses calls with ErrCircuitOpen
// (opened by failures Redis proved) or ErrStalledOpen (opened by stalls
// alone) and reads errors with Classify (see breakerOutcome). Safe for
// concurrent use; use NewBreaker.
type Breaker struct {
	*breaker.Breaker
	// login, when set, is told of every refused login among the
	// outcomes recorded (see loginGate).
	login *loginGate
}

// breakerErrors are the Redis errors of a Breaker.
var breakerErrors = breaker.Errors{Open: ErrCircuitOpen, StalledOpen: ErrStalledOpen, Outcome: breakerOutcome}

// NewBreaker returns a closed breaker. now is its clock for Do and Healthy
// (nil: time.Now). o must be valid (see BreakerOptions.Validate).
func NewBreaker(o BreakerOptions, now func() time.Time) *Breaker {
	return &Breaker{Breaker: breaker.New(o, breakerErrors, now)}
}

// breakerOutcome classifies err (Classify) for the breaker: cancellations,
// deadlines, refusals of the breaker itself, refused logins and
// ErrLoginBackoff are Neutral (a refused login proves the server up but
// not that it will serve: a half-open probe must not close the circuit on
// it); a lost connection (CauseReset) is Dropped; outage errors are Stalled when they are timeouts or stalls
// (ErrStalled) and Failed otherwise; every other error is a reply from a
// live server (Answered).
func breakerOutcome(err error) breaker.Outcome {
	var e *Error
	errors.As(Classify(err), &e) // always true for err != nil
	neutral := e.Cause() == CauseCanceled || e.Cause() == CauseCircuitOpen || e.Cause() == CauseDeadline || e == ErrStalledOpen ||
		errors.Is(e, ErrLoginBackoff) || loginRefusal(e)
	if e.Cause() == CauseReset && !neutral {
		return breaker.Dropped
	}
	stall := e.Cause() == CauseTimeout || e.Cause() == CauseStalled
	return breaker.OutcomeOf(e.Outage(), stall, neutral)
}

// now is the breaker's clock.
func (b *Breaker) now() time.Time { return b.Now() }

// record is RecordSince: the outcome of a call that started at start.
func (b *Breaker) record(start, now time.Time, err error) {
	b.RecordSince(start, now, err)
	b.login.observe(err)
}

// Do runs fn under the breaker (breaker.Breaker.Do) and returns fn's error
// classified (an *Error with a Cause), or nil, or the refusal while the
// circuit is open.
func (b *Breaker) Do(ctx context.Context, timeout time.Duration, fn func(context.Context) error) error {
	err := b.Breaker.Do(ctx, timeout, func(ctx context.Context) error { return Classify(fn(ctx)) })
	b.login.observe(err)
	return err
}
