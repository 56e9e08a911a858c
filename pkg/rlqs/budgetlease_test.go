package rlqs

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// budgetRun runs one simulated Envoy with demand (per second) on the
// bucket api=search of cfg, against one replica on a fresh redis-server
// with window keys (the default) and leases, as cmd/ratelimitd wires
// them, from start for dur. The store's memory begins at start, after the
// window of a longer limit began, as a redis-server started that day does.
func budgetRun(t *testing.T, cfg string, start time.Time, demand float64, dur time.Duration) fleetResult {
	t.Helper()
	srv := redistest.Standalone(t)
	clock := &fakeClock{t: start}
	set, _, err := policy.LoadSources(policy.LoadOptions{}, policy.Source{Name: "budget.yaml", Data: []byte(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 2 * time.Second
	o.Now = clock.Now
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	f := &fleetRun{demand: []float64{demand}, duration: dur, replicas: []*Server{newReplica(t, s, s, clock, "a", set)}}
	res := f.run(t, clock)
	t.Logf("admitted per second: %v", res.admitted)
	if res.rates[0] == nil || res.rates[0][0] <= 0 {
		t.Errorf("first assignment is not a token bucket (rate %v) with the whole budget left", res.rates[0])
	}
	return res
}

// TestRedisDayBudgetNextToSecondLimit: a rule of 100 per second and
// 100,000 per day on Redis with window keys, an Envoy with demand 150 per
// second: from the third second on it admits at least 90 % of the
// per-second limit, and never more than it. The day's window began before
// the redis-server did; its budget is not leased (a lease would assume such
// a window full and the bucket was sent DENY_ALL).
func TestRedisDayBudgetNextToSecondLimit(t *testing.T) {
	res := budgetRun(t, `domain: edge
descriptors:
  - key: api
    value: search
    rate_limits:
      - {unit: second, requests_per_unit: 100}
      - {unit: day, requests_per_unit: 100000}
`, time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC), 150, 10*time.Second)
	for s, a := range res.admitted {
		if s >= 3 && a < 90 {
			t.Errorf("second %d: admitted %d, want >= 90 (90 %% of 100 per second, the day's budget has room)", s, a)
		}
		if a > 100 {
			t.Errorf("second %d: admitted %d, over the limit of 100 per second", s, a)
		}
	}
}

// TestRedisMinuteBudget: 600 per minute on Redis with window keys, the
// store started 20 s into the minute, an Envoy with demand 20 per second
// for the rest of it: it admits at least 90 % of the minute's budget, and
// never more than it.
func TestRedisMinuteBudget(t *testing.T) {
	res := budgetRun(t, `domain: edge
descriptors:
  - key: api
    value: search
    rate_limit: {unit: minute, requests_per_unit: 600}
`, time.Date(2026, 12, 6, 12, 0, 20, 0, time.UTC), 20, 40*time.Second)
	var total int64
	for _, a := range res.admitted {
		total += a
	}
	t.Logf("admitted %d of 600 in the minute", total)
	if total < 540 || total > 600 {
		t.Errorf("admitted %d in the minute, want 540..600 (at least 90 %% of the budget, never over it)", total)
	}
}

// TestNewStreamOnSpentDayBudget: ShouldRateLimit's hits spend a day's
// budget of 300 on Redis; a new stream's first answer for the bucket is
// DENY_ALL (the budget is read before the answer, not at the next round),
// and a bucket of another tenant, whose budget has room, gets a token
// bucket.
func TestNewStreamOnSpentDayBudget(t *testing.T) {
	const cfg = `domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 300}
`
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 2 * time.Second
	o.Now = (&fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}).Now
	store, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	// The join's store calls get a budget a loaded host meets (see
	// TestNewStreamOnSpentBudget).
	r := newRig(t, cfg, store, func(o *Options) { o.Leases, o.joinTimeout, o.roundTimeout = store, 30*time.Second, 30*time.Second })
	set := loadSet(t, cfg)
	m, ok := set.Match("edge", []policy.Entry{{Key: "tenant", Value: "t1"}})
	if !ok {
		t.Fatal("no rule for tenant=t1")
	}
	d := make([]algo.Decision, 1)
	if err := store.Take(context.Background(), []algo.Hit{{Key: set.Key(m, 0), Limit: m.Rule.Limits[0].Limit, Cost: 300}}, d); err != nil || !d[0].Allowed {
		t.Fatalf("the day's 300 hits: %+v, %v", d[0], err)
	}
	c := r.open()
	spent := map[string]string{"tenant": "t1"}
	c.send("edge", usage(spent, 0, 1, 0))
	if got := blanketOf(checkTTL(t, action(t, c.recv(), spent), r.srv.TTL())); got != "DENY_ALL" {
		t.Errorf("first answer on a spent day's budget: %s, want DENY_ALL", got)
	}
	other := map[string]string{"tenant": "t2"}
	c.send("edge", usage(other, 0, 1, 0))
	if got := blanketOf(checkTTL(t, action(t, c.recv(), other), r.srv.TTL())); got != "token_bucket" {
		t.Errorf("first answer with the day's budget left: %s, want token_bucket", got)
	}
}
