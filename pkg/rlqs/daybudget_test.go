package rlqs

import (
	"context"
	"testing"
	"time"
)

// dayBudgetConfig is a plan of 5 per second and 1000 per day.
const dayBudgetConfig = `domain: edge
descriptors:
  - key: plan
    value: free
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: day, requests_per_unit: 1000}
`

// TestDayBudgetAssignsShortLimitsRate: a bucket on a rule of 5 per second
// and 1000 per day, with a demand of 10 per second, is assigned the per-second
// limit's rate while the day's budget has room, not the day's 1000
// spread over 86,400 s; once the day's budget is spent it is sent
// DENY_ALL.
func TestDayBudgetAssignsShortLimitsRate(t *testing.T) {
	r := newRig(t, dayBudgetConfig, nil)
	c := r.open()
	id := map[string]string{"plan": "free"}
	c.send("edge", usage(id, 0, 1, 0))
	c.recv()
	check := false // the first round still divides by the joining round's view (the floor)
	round := func(allowed, denied uint64) string {
		t.Helper()
		n := r.srv.reported.Load()
		r.clock.Add(time.Second)
		c.send("edge", usage(id, time.Second, allowed, denied))
		waitFor(t, "report processed", func() bool { return r.srv.reported.Load() > n })
		r.srv.Round(context.Background())
		st := checkTTL(t, action(t, c.recv(), id), r.srv.TTL())
		if tb := st.GetTokenBucket(); tb != nil {
			rate := float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
			// The per-second limit's rate: 5 less the bucket's 2 tokens.
			if check && (rate < 3 || rate > 5) {
				t.Errorf("assigned %.3f per second with the day's budget left, want the per-second limit's rate (3..5)", rate)
			}
			return "token_bucket"
		}
		return blanketOf(st)
	}
	for i := 0; i < 3; i++ {
		check = i > 0
		if got := round(5, 5); got != "token_bucket" {
			t.Fatalf("round %d: %s, want token_bucket", i, got)
		}
	}
	if got := round(990, 0); got != "DENY_ALL" {
		t.Errorf("the day's budget spent: %s, want DENY_ALL", got)
	}
}
