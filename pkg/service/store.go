package service

import (
	"context"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Store decides the hits of one request. Implementations: the memory
// backend (pkg/backend/memory), the Redis backend (pkg/backend/redis) and
// the memcached backend (pkg/backend/memcache, fixed windows only; see
// AlgorithmLister and docs/memcached.md for what all-or-nothing means
// there).
// The service never imports a concrete backend; cmd/ratelimitd wires one in.
type Store interface {
	// Take decides all hits of one request atomically. When any hit that
	// is not Soft is denied (check-only hits with Cost 0 included), only
	// the Kept hits consume: releases (refunds, is_negative_hits) and
	// always_charge hits (algo.Hit.Kept), replayed in order on the state
	// before the request, each reporting the state after its own hit;
	// every other hit consumes nothing (Decision.Remaining then reports
	// the value before the request). So with all_or_nothing counting a
	// denied request consumes nothing. len(result) == len(hits), same
	// order. Hits with the same Key are applied in order, each seeing the
	// previous one (algotest.Reference is the executable definition).
	//
	// An error means the backend could not decide (unreachable, timeout,
	// out of memory, read-only, circuit open); the service then applies
	// each rule's failure mode. Errors should wrap ErrUnavailable-style
	// causes so that Cause(err) gives a bounded metric label.
	Take(ctx context.Context, hits []algo.Hit) ([]algo.Decision, error)
}

// Causer is implemented by backend errors that know a bounded cause label
// for ratelimitd_backend_errors_total{cause} (e.g. "timeout", "refused",
// "oom", "readonly", "circuit_open", "other").
type Causer interface {
	Cause() string
}

// Healther is optionally implemented by a Store that can report whether its
// backend is currently reachable (for /healthcheck and gRPC health).
type Healther interface {
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
	Algorithms() []algo.Kind
}
