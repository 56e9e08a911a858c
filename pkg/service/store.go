package service

import (
	"context"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Store decides the hits of one request. This is the one statement of the
// contract every backend meets; algotest.Reference (pkg/algo/algotest) is
// its executable definition, and algotest.Run checks a store against both
// the hand-derived tables and Reference (the memory, Redis standalone,
// Redis Cluster and memcached stores run it). Implementations: the memory
// backend (pkg/backend/memory), the Redis backend (pkg/backend/redis:
// take.lua and its one-hit fast path take1.lua) and the memcached backend
// (pkg/backend/memcache, fixed windows only; see AlgorithmLister and
// docs/memcached.md for what all-or-nothing means there); and, as
// Options.Durable for the limits with `store: durable`, the PostgreSQL
// store (pkg/backend/postgres). The service never imports a concrete
// backend; cmd/ratelimitd wires them in.
//
// Input. hits are the request's hits in request order (the service builds
// one per applied limit of each descriptor, in descriptor order). Each
// algo.Hit names its counter by Key (opaque: a store may derive its own
// key from it, e.g. memcached's per-window key, but never parses it),
// its Limit (rate per Period, µs resolution), and Cost in units (0: a
// check; at most algo.MaxCost, a larger cost is MaxCost, which every
// limit denies), with Soft, Release and Charge as algo.Hit documents
// them. A key without state is the zero algo.State: the full quota.
// Hits with the same Key are applied in order, each seeing the previous
// one's tentative state. Take must not retain hits after it returns (the
// service reuses the slice), and must be safe for concurrent use: each
// call is atomic with respect to every other.
//
// Decisions. Each hit is applied at the store's current instant (the
// memory and memcached stores' Options.Now, the Redis server's TIME) with
// algo.Apply. When no hit that is not Soft is denied
// (a check-only hit too can deny), every hit's new state is kept. When one
// is, only the Kept hits (algo.Hit.Kept: releases, and always_charge hits
// of every kind but concurrency) consume: they are replayed in order on
// the states before the request and each reports the state after its own
// hit; every other hit consumes nothing, and one that did not deny reports
// a check (algo.Take with cost 0) on its key's replayed state (the value
// before the request when no Kept hit shares its key); a hit that denied
// keeps its decision. So under all_or_nothing a denied request consumes
// nothing, and a Soft hit's denial writes nothing for it but does not
// roll the request back.
//
// Output. out has one element per hit (len(out) == len(hits)); on
// success Take has written each hit's decision into it, in the same
// order. The array is the caller's: Take writes it only before it
// returns (never after, even when the caller's context ends first), and
// does not keep it. On error its content is unspecified. In
// each algo.Decision, Remaining is whole units (>= 0), RetryAfter is 0
// when Allowed, and RetryAfter, ResetAfter and WindowAfter are exact to
// the microsecond; FromCache is true only for a denial a store's local
// over-limit cache answered.
//
// Errors. An error means the store could not decide the request
// (unreachable, timeout, out of memory, read-only, circuit open, full);
// the service then applies each rule's failure_mode, and no decision of
// the call is used. A store never reports half a request (every hit is
// decided or the call fails), but the counters may hold part of it for a
// while: after a timeout the backend may have applied the request without
// the reply arriving, and a Redis Cluster request whose slot groups partly
// failed is reversed by a compensating refund (docs/redis.md). Errors should implement Causer, so that the cause label
// is bounded; a context error counts as "timeout" (deadline) or
// "canceled". The causes "deadline" (not decided within the caller's
// deadline while the backend was answering) and "timeout" (the backend
// was silent) mean "not decided in time": a request that only
// failure_mode open would admit is then answered DeadlineExceeded instead
// of being admitted uncounted.
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
// which refuses a config with a limit of any other algorithm, at its
// file:line, naming the backend: such a config never replaces the one in
// force, and at startup the service does not become SERVING. A Store
// without it decides every algorithm.
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
