package service

import (
	"context"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Store decides the hits of one request. This doc states what every
// backend must do; algotest.Reference is its executable definition, and
// algotest.Run checks a store against it (the memcached store, fixed
// windows only, within the limits docs/memcached.md states). The service
// never imports a concrete backend: cmd/ratelimitd wires them in.
//
// Input. hits are the request's hits in request order. Key names a counter
// opaquely (a store may derive its own keys from it, never parse it); Cost
// is in units (0: a check; a cost above algo.MaxCost counts as MaxCost,
// which every limit denies); Limit, Soft, Release and Charge are as algo.Hit
// documents them. A key without state has its full quota. Hits with the
// same Key apply in order, each seeing the previous one's tentative state.
// Take must not retain hits, and each call is atomic with respect to every
// other.
//
// Decisions. Each hit is applied with algo.Apply at the store's current
// instant (its Options.Now, or the Redis server's TIME). When no hit that
// is not Soft is denied, every new state is kept. Otherwise only the Kept
// hits (algo.Hit.Kept) consume, replayed in order on the states before the
// request; every other hit consumes nothing, and one that did not deny
// reports a check (cost 0) on its key's replayed state. So a denied request
// consumes nothing but its Kept hits, and a Soft hit's denial does not roll
// the request back.
//
// Output. On success out (len(out) == len(hits)) holds each hit's decision
// in order. Take writes out only before it returns and does not keep it; on
// error its content is unspecified. Remaining is whole units (>= 0),
// RetryAfter is 0 when Allowed, durations are exact to the microsecond, and
// FromCache marks a denial a local over-limit cache answered.
//
// Errors. An error means the store could not decide the request: the
// service applies each rule's failure_mode and uses no decision of the
// call. The counters may still hold part of it (the reply lost after a
// timeout; a Redis Cluster request being reversed by a compensating
// refund). Errors should implement Causer so that the cause label is
// bounded; a context error counts as "timeout" or "canceled". The causes
// "deadline" and "timeout" mean "not decided in time": a request that only
// failure_mode open would admit is then answered DeadlineExceeded rather
// than admitted uncounted.
type Store interface {
	// Take decides hits, one request, into out, as Store documents.
	Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error
}

// Leaser decides the hits of leased limits (policy.Leased) from units
// the instance leased from the store in advance (pkg/lease.Leaser).
type Leaser interface {
	// Take decides hits, all of leased limits; the hits of one request
	// are all-or-nothing. undo gives back what the allowed hits took,
	// for a request another limit denied. failed lists the hits it
	// could not decide (no units left and the store failing, or ctx
	// ended), err says why.
	Take(ctx context.Context, hits []algo.Hit) (decs []algo.Decision, failed []int, undo func(), err error)
}

// Causer is implemented by backend errors that know a bounded cause label
// for ratelimitd_backend_errors_total{cause} (e.g. "timeout", "refused",
// "oom", "readonly", "circuit_open", "other").
type Causer interface {
	// Cause is the label value: a short lower-case word from a fixed set,
	// never built from request data; "" is reported as "other".
	Cause() string
}

// PartialFailure is implemented by a Store error for a request the Store
// decided in parts (Redis Cluster: one script call per hash slot) when
// some parts failed and another part denied the request, which decides it
// whatever the failed parts would have said (all-or-nothing). The service
// answers the decided hits and applies the failure modes to the failed
// ones only, so the request stays denied; a Store error without it fails
// every hit of the request. The Redis store returns a *causes.Partial.
type PartialFailure interface {
	error
	// Decided returns one decision per hit of the request (those at the
	// failed indexes are not used) and the failed hits' indexes.
	Decided() (decisions []algo.Decision, failed []int)
}

// Healther is optionally implemented by a Store that can report whether its
// backend is currently reachable (for /healthcheck and gRPC health).
type Healther interface {
	// Healthy reports whether decisions made now are counted by the
	// backend; false while it is unreachable, refusing writes or warming up.
	Healthy() bool
}

// AlgorithmLister is optionally implemented by a Store that decides some
// algorithms only (the memcache backend: fixed_window). cmd/ratelimitd
// passes the list to the config loader (policy.LoadOptions.Algorithms),
// which then refuses a limit of any other algorithm at its file:line. A
// Store without it decides every algorithm.
type AlgorithmLister interface {
	// Algorithms is the list of kinds the Store decides, in any order; a
	// nil or empty list means none.
	Algorithms() []algo.Kind
}

// PenaltyBoxer is optionally implemented by a Store that says whether it
// decides penalty boxes (algo.Hit.Penalty) in the same atomic step as
// their limit. cmd/ratelimitd passes a false answer to the config loader
// (policy.LoadOptions.NoPenalty), which then refuses a `penalty:` at its
// file:line, naming the backend, as it refuses an unsupported algorithm.
// A Store without it decides them.
type PenaltyBoxer interface {
	// PenaltyBoxes reports whether the Store decides penalty boxes.
	PenaltyBoxes() bool
}
