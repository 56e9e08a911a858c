package algotest_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
)

func TestReferenceStore(t *testing.T) {
	algotest.Run(t, func(t *testing.T, now func() time.Time) algotest.Store {
		return algotest.NewReferenceStore(now)
	})
}

// brokenStore ignores all-or-nothing; the suite must notice.
type brokenStore struct {
	now    func() time.Time
	states map[string]algo.State
}

func (s *brokenStore) Take(_ context.Context, hits []algo.Hit, out []algo.Decision) error {
	for i, h := range hits {
		s.states[h.Key], out[i] = algo.Apply(s.states[h.Key], h, s.now())
	}
	return nil
}

func TestSuiteCatchesBrokenStore(t *testing.T) {
	failed := false
	for _, tb := range algotest.Tables() {
		if tb.Name != "multi_hit" {
			continue
		}
		s := &brokenStore{states: map[string]algo.State{}}
		for _, st := range tb.Steps {
			at := algotest.Base.Add(st.At)
			s.now = func() time.Time { return at }
			got, _ := algotest.Take(context.Background(), s, st.Hits)
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
