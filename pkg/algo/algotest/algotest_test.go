package algotest_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
)

// refStore is the simplest store that meets the Store contract: a map, one
// request at a time. It checks the tables themselves.
type refStore struct {
	now    func() time.Time
	states map[string]algo.State
}

func (s *refStore) Take(_ context.Context, hits []algo.Hit) ([]algo.Decision, error) {
	now := s.now()
	tent := map[string]algo.State{}
	out := make([]algo.Decision, len(hits))
	denied := false
	for i, h := range hits {
		st, ok := tent[h.Key]
		if !ok {
			st = s.states[h.Key]
		}
		ns, d := algo.Apply(st, h, now)
		tent[h.Key] = ns
		out[i] = d
		if !d.Allowed && !h.Soft {
			denied = true
		}
	}
	if denied {
		for i, h := range hits {
			if out[i].Allowed {
				_, out[i] = algo.Take(h.Limit, s.states[h.Key], now, 0)
			}
		}
		return out, nil
	}
	for k, v := range tent {
		s.states[k] = v
	}
	return out, nil
}

func TestReferenceStore(t *testing.T) {
	algotest.Run(t, func(t *testing.T, now func() time.Time) algotest.Store {
		return &refStore{now: now, states: map[string]algo.State{}}
	})
}

// brokenStore ignores all-or-nothing; the suite must notice.
type brokenStore struct{ refStore }

func (s *brokenStore) Take(_ context.Context, hits []algo.Hit) ([]algo.Decision, error) {
	out := make([]algo.Decision, len(hits))
	for i, h := range hits {
		s.states[h.Key], out[i] = algo.Apply(s.states[h.Key], h, s.now())
	}
	return out, nil
}

func TestSuiteCatchesBrokenStore(t *testing.T) {
	failed := false
	for _, tb := range algotest.Tables() {
		if tb.Name != "multi_hit" {
			continue
		}
		s := &brokenStore{refStore{states: map[string]algo.State{}}}
		for _, st := range tb.Steps {
			at := algotest.Base.Add(st.At)
			s.now = func() time.Time { return at }
			got, _ := s.Take(context.Background(), st.Hits)
			for j := range got {
				if got[j] != st.Want[j] {
					failed = true
				}
			}
		}
	}
	if !failed {
		t.Fatal("a store without all-or-nothing passed the multi_hit table")
	}
}
