// Package algotest is the conformance suite every ratelimitd store passes,
// in the spirit of testing/fstest: tables of steps over fixed instants, each
// step one request (a list of hits) with the exact decisions expected, field
// by field, and each decision also compared with Reference (the Store
// contract's executable definition) on the same requests. The memory
// store, the Redis store (standalone and Cluster) and the memcached store
// (its fixed-window tables) run the same tables, which is how the Go
// algorithms (pkg/algo) and the Redis scripts are proven equal.
//
// Usage, from a store's test:
//
//	algotest.Run(t, func(t *testing.T, now func() time.Time) algotest.Store {
//		s, err := memory.New(memory.Options{Now: now})
//		...
//		return s
//	})
package algotest

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Store is the shape of service.Store (declared here so that algotest does
// not import the service).
type Store interface {
	// Take decides the hits of one request into out with the semantics
	// of service.Store.Take: len(out) == len(hits), same order; a
	// non-nil error fails the step. Reference is the executable
	// definition of the expected decisions.
	Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error
}

// Take calls s.Take with a new array of len(hits) decisions and returns
// it (nil on error): the shape tests find convenient.
func Take(ctx context.Context, s Store, hits []algo.Hit) ([]algo.Decision, error) {
	out := make([]algo.Decision, len(hits))
	if err := s.Take(ctx, hits, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Base is the instant every table's offsets start from: 2026-01-01T00:00Z,
// aligned to every epoch-aligned unit up to a day (and to calendar months
// and years).
var Base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Step is one request at Base+At (or at Abs when set): Hits in order, and
// the decisions the store must return, exactly.
type Step struct {
	// At is the step's instant as an offset from Base; used when Abs is
	// the zero time.
	At time.Duration
	// Abs, when not the zero time, is the step's instant, overriding At.
	Abs time.Time
	// Hits is the request, in order. Keys are short names that Run
	// prefixes per run and table.
	Hits []algo.Hit
	// Want is the decisions the store must return, one per hit, compared
	// field by field.
	Want []algo.Decision
}

// Table is a named sequence of steps run against one store. Hit keys are
// short names; Run makes them unique per run and table.
type Table struct {
	// Name is the subtest name (t.Run) and part of the key prefix.
	Name string
	// Steps run in order against one fresh store.
	Steps []Step
}

var runID atomic.Int64

// Run runs every table of Tables against a fresh store per table. newStore
// must return a store that reads the current instant from now (the suite
// moves it between steps; now is safe for concurrent use). Every decision
// must equal the table's and Reference's for the same requests.
func Run(t *testing.T, newStore func(t *testing.T, now func() time.Time) Store) {
	t.Helper()
	RunTables(t, Tables(), newStore)
}

// RunTables is Run over the given tables (a subset of Tables, for a store
// that implements some algorithms only).
func RunTables(t *testing.T, tables []Table, newStore func(t *testing.T, now func() time.Time) Store) {
	t.Helper()
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36) + "." + strconv.FormatInt(runID.Add(1), 10)
	for _, tb := range tables {
		t.Run(tb.Name, func(t *testing.T) {
			var clock atomic.Int64
			clock.Store(Base.UnixMicro())
			now := func() time.Time { return time.UnixMicro(clock.Load()) }
			s := newStore(t, now)
			ref := map[string]algo.State{} // Reference's states, beside the store's
			prefix := "algotest/" + nonce + "/" + tb.Name + "/"
			for i, st := range tb.Steps {
				at := Base.Add(st.At)
				if !st.Abs.IsZero() {
					at = st.Abs
				}
				clock.Store(at.UnixMicro())
				hits := make([]algo.Hit, len(st.Hits))
				for j, h := range st.Hits {
					h.Key = prefix + h.Key
					hits[j] = h
				}
				got, err := Take(context.Background(), s, hits)
				if err != nil {
					t.Fatalf("step %d at %v: Take: %v", i, at, err)
				}
				if len(got) != len(st.Want) {
					t.Fatalf("step %d at %v: %d decisions, want %d", i, at, len(got), len(st.Want))
				}
				want := Reference(ref, hits, at)
				for j := range got {
					if got[j] != want[j] {
						t.Errorf("step %d at %v (%s) hit %d %s: differs from Reference:\n got %s\n ref %s",
							i, at, at.Sub(Base), j, st.Hits[j].Key, fmtDecision(got[j]), fmtDecision(want[j]))
					}
					if got[j] != st.Want[j] {
						t.Errorf("step %d at %v (%s) hit %d %s cost %d release %v:\n got %s\nwant %s",
							i, at, at.Sub(Base), j, st.Hits[j].Key, st.Hits[j].Cost, st.Hits[j].Release,
							fmtDecision(got[j]), fmtDecision(st.Want[j]))
					}
				}
				if t.Failed() {
					t.FailNow()
				}
			}
		})
	}
}

func fmtDecision(d algo.Decision) string {
	return fmt.Sprintf("{allowed %v remaining %d retry %v reset %v window %v}", d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, d.WindowAfter)
}

// OK is an allowed decision.
func OK(rem int64, reset, window time.Duration) algo.Decision {
	return algo.Decision{Allowed: true, Remaining: rem, ResetAfter: reset, WindowAfter: window}
}

// Deny is a denied decision.
func Deny(rem int64, retry, reset, window time.Duration) algo.Decision {
	return algo.Decision{Remaining: rem, RetryAfter: retry, ResetAfter: reset, WindowAfter: window}
}

// one is a single-hit step.
func one(at time.Duration, key string, l algo.Limit, cost int64, want algo.Decision) Step {
	return Step{At: at, Hits: []algo.Hit{{Key: key, Limit: l, Cost: cost}}, Want: []algo.Decision{want}}
}

func oneAbs(at time.Time, key string, l algo.Limit, cost int64, want algo.Decision) Step {
	s := one(0, key, l, cost, want)
	s.Abs = at
	return s
}

func rel(at time.Duration, key string, l algo.Limit, n int64, want algo.Decision) Step {
	return Step{At: at, Hits: []algo.Hit{{Key: key, Limit: l, Cost: n, Release: true}}, Want: []algo.Decision{want}}
}
