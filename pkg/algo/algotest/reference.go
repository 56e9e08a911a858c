package algotest

import (
	"context"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Reference decides one request (hits, in order) at now the way the Store
// contract (pkg/service Store, where it is written out) says, with
// pkg/algo alone, and updates states (key → state; a
// missing key is the zero State) in place: each hit is applied to the
// tentative state its key has so far in the request (algo.Apply). When no
// hit that is not Soft is denied, every tentative state is kept.
// Otherwise (a check-only hit too can deny) the request is replayed on
// the states before it with only its Kept hits (releases and
// always_charge hits, algo.Hit.Kept): those are applied in order and
// report their replayed decision; a penalized hit (algo.Hit.Penalized)
// that denied keeps its denial count and block (algo.KeepPenalty), and a
// Soft hit keeps nothing, not even a count an earlier hit of the request
// made; the other hits that did not deny
// report a check (algo.Take with cost 0) on their key's replayed state at
// their place in the request, and the hits that denied keep their
// decision. The returned slice has one decision per hit.
//
// It is the reference the stores' property tests compare against (the
// Redis script, batched segments, the previous script version).
func Reference(states map[string]algo.State, hits []algo.Hit, now time.Time) []algo.Decision {
	tent := make(map[string]algo.State, len(hits))
	out := make([]algo.Decision, len(hits))
	after := make([]algo.State, len(hits)) // each hit's state after it
	denied := false
	for i, h := range hits {
		st, ok := tent[h.Key]
		if !ok {
			st = states[h.Key]
		}
		ns, d := algo.Apply(st, h, now)
		tent[h.Key] = ns
		after[i] = ns
		out[i] = d
		denied = denied || !d.Allowed && !h.Soft
	}
	if !denied {
		for k, s := range tent {
			states[k] = s
		}
		return out
	}
	clear(tent)
	for i, h := range hits {
		st, ok := tent[h.Key]
		if !ok {
			st = states[h.Key]
		}
		switch {
		case h.Kept():
			st, out[i] = algo.Apply(st, h, now)
			tent[h.Key] = st
		case !out[i].Allowed && h.Penalized():
			tent[h.Key] = algo.KeepPenalty(st, after[i])
		case out[i].Allowed:
			_, out[i] = algo.Take(h.Limit, st, now, 0)
		}
	}
	for k, s := range tent {
		states[k] = s
	}
	return out
}

// ReferenceStore is Reference as a Store: the states of every key in a
// map, one request at a time, at the instant Now returns. It never fails
// and implements nothing but Take (no reset, no health). Tests of code
// above the Store (pkg/service) decide with it, so that no test invents
// its own semantics; a test that needs a failing or stalling store wraps
// it. Safe for concurrent use.
type ReferenceStore struct {
	now    func() time.Time
	mu     sync.Mutex
	states map[string]algo.State
}

// NewReferenceStore returns an empty ReferenceStore that reads the current
// instant from now.
func NewReferenceStore(now func() time.Time) *ReferenceStore {
	return &ReferenceStore{now: now, states: map[string]algo.State{}}
}

// Take decides hits into out with Reference at s's now; the error is
// always nil.
func (s *ReferenceStore) Take(_ context.Context, hits []algo.Hit, out []algo.Decision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	copy(out, Reference(s.states, hits, s.now()))
	return nil
}
