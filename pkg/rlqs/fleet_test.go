package rlqs

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// fleetConfig is one global limit on a bucket every Envoy shares.
const fleetConfig = `domain: edge
descriptors:
  - key: api
    value: search
    rate_limit:
      unit: second
      requests_per_unit: %d
`

// fleetRun is one simulated run: Envoys with uneven demand (requests per
// second) against replicas sharing a store; one replica is killed at kill
// (0: never).
type fleetRun struct {
	limit    int64
	demand   []float64
	duration time.Duration
	kill     time.Duration
	replicas []*Server
	// load, when set, is other traffic on the fleet's counter (as
	// ShouldRateLimit decides it), every tick: it returns the hits admitted.
	load func(now time.Time) int64
}

// fleetResult is what the Envoys admitted, per second of the run, and each
// Envoy's assigned rate after each second's rounds.
type fleetResult struct {
	admitted []int64
	loaded   []int64     // admitted by fleetRun.load, per second
	rates    [][]float64 // [second][envoy]
	envoys   []*simEnvoy
}

const tick = 10 * time.Millisecond

func (f *fleetRun) run(t *testing.T, clock *fakeClock) fleetResult {
	t.Helper()
	envoys := make([]*simEnvoy, len(f.demand))
	for i := range envoys {
		envoys[i] = &simEnvoy{t: t, clock: clock, domain: "edge", id: map[string]string{"api": "search"}}
		envoys[i].connect(f.replicas[i%len(f.replicas)])
	}
	dead := map[*Server]bool{}
	live := func() []*Server {
		var out []*Server
		for _, r := range f.replicas {
			if !dead[r] {
				out = append(out, r)
			}
		}
		return out
	}
	acc := make([]float64, len(envoys))
	secs := int(f.duration / time.Second)
	res := fleetResult{admitted: make([]int64, secs), loaded: make([]int64, secs), rates: make([][]float64, secs), envoys: envoys}
	start := clock.Now()
	for step := 0; step < int(f.duration/tick); step++ {
		now := clock.Now()
		el := now.Sub(start)
		if f.kill > 0 && el == f.kill {
			// The replica dies without a handoff: its streams break.
			victim := f.replicas[len(f.replicas)-1]
			dead[victim] = true
			for _, e := range envoys {
				if e.srv == victim {
					e.stream.cancel()
				}
			}
		}
		for i, e := range envoys {
			if e.broken() {
				ls := live()
				e.connect(ls[i%len(ls)])
			}
			acc[i] += f.demand[i] * tick.Seconds()
			n := int64(acc[i])
			acc[i] -= float64(n)
			if n == 0 {
				continue
			}
			if e.b == nil {
				// The bucket's first request: no assignment yet, reported at once.
				e.b = &simBucket{id: e.id}
				n--
				e.admit(now, 1)
				res.admitted[el/time.Second]++
				e.report(now, true)
			}
			res.admitted[el/time.Second] += e.admit(now, n)
			if now.Sub(e.b.lastReport) >= time.Second {
				e.report(now, false)
			}
		}
		if f.load != nil {
			res.loaded[el/time.Second] += f.load(now)
		}
		if el%time.Second == 500*time.Millisecond {
			for _, r := range live() {
				before := make([]int, len(envoys))
				for i, e := range envoys {
					before[i] = e.responseCount()
				}
				r.Round(context.Background())
				for i, e := range envoys {
					if e.srv == r && !e.broken() {
						waitFor(t, "round answered", func() bool { return e.responseCount() > before[i] })
					}
				}
			}
			rates := make([]float64, len(envoys))
			for i, e := range envoys {
				e.mu.Lock()
				if e.b != nil && e.b.strategy.GetTokenBucket() != nil {
					rates[i] = e.b.rate
				}
				e.mu.Unlock()
			}
			res.rates[el/time.Second] = rates
		}
		clock.Add(tick)
	}
	for _, e := range envoys {
		e.stream.cancel()
		e.mu.Lock()
		if len(e.violations) > 0 {
			t.Errorf("%d assignments Envoy's client misreads, the first: %v", len(e.violations), e.violations[:min(3, len(e.violations))])
		}
		e.mu.Unlock()
	}
	return res
}

// maxMinFair divides budget among demands max-min fairly.
func maxMinFair(budget float64, demand []float64) []float64 {
	idx := make([]int, len(demand))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return int(math.Copysign(1, demand[a]-demand[b])) })
	out := make([]float64, len(demand))
	for k, i := range idx {
		share := budget / float64(len(idx)-k)
		out[i] = math.Min(demand[i], share)
		budget -= out[i]
	}
	return out
}

// check asserts the bounds of docs/rlqs.md on a run: at most 2 % over the
// limit over the run and 10 % in the worst 10-second window, at least 90 %
// of the limit admitted, and every Envoy's rate its max-min fair share
// within 3 reporting intervals of the start and of the kill.
func (f *fleetRun) check(t *testing.T, r fleetResult) {
	t.Helper()
	secs := len(r.admitted)
	t.Logf("admitted per second: %v", r.admitted)
	var total int64
	for _, a := range r.admitted {
		total += a
	}
	worst, worstAt := int64(0), 0
	for s := 0; s+10 <= secs; s++ {
		var w int64
		for _, a := range r.admitted[s : s+10] {
			w += a
		}
		if w > worst {
			worst, worstAt = w, s
		}
	}
	limitRun := f.limit * int64(secs)
	over := float64(total)/float64(limitRun) - 1
	overWindow := float64(worst)/float64(f.limit*10) - 1
	t.Logf("admitted %d of a limit of %d over %d s: %+.2f %% (bound +2 %%); worst 10-s window from %d s: %d of %d, %+.2f %% (bound +10 %%); use of the limit %.1f %% (bound >= 90 %%)",
		total, limitRun, secs, 100*over, worstAt, worst, f.limit*10, 100*overWindow, 100*float64(total)/float64(limitRun))
	if over > 0.02 {
		t.Errorf("over the limit over the run: %+.2f %% > 2 %%", 100*over)
	}
	if overWindow > 0.10 {
		t.Errorf("over the limit in the worst 10-s window: %+.2f %% > 10 %%", 100*overWindow)
	}
	if float64(total) < 0.9*float64(limitRun) {
		t.Errorf("admitted %.1f %% of the limit, want >= 90 %%", 100*float64(total)/float64(limitRun))
	}
	// Fairness: within 3 reporting intervals of the start and of the kill,
	// every Envoy's rate is its max-min fair share of what the rates
	// divide (the limit less the buckets' headroom).
	n := len(f.demand)
	burst := max(1, int64(DefaultHeadroom*float64(f.limit))/int64(n))
	fair := maxMinFair(float64(f.limit-burst*int64(n)), f.demand)
	settled := func(s int) bool {
		if s < 3 {
			return false
		}
		k := int(f.kill / time.Second)
		return f.kill == 0 || s < k || s >= k+3
	}
	fairAt := func(s int) bool {
		for i, got := range r.rates[s] {
			if math.Abs(got-fair[i]) > math.Max(0.03*fair[i], 2) {
				return false
			}
		}
		return r.rates[s] != nil
	}
	since := func(from int) string {
		for s := from; s < len(r.rates); s++ {
			if fairAt(s) {
				return fmt.Sprintf("%d", s-from)
			}
		}
		return "never"
	}
	k := int(f.kill / time.Second)
	if f.kill == 0 {
		k = 0
	}
	t.Logf("max-min fair shares (within 3 %% or 2/s) from the round at %s.5 s after the start, %s.5 s after the kill (bound: 3 intervals)", since(0), since(k))
	bad := 0
	for s, rates := range r.rates {
		if !settled(s) || rates == nil {
			continue
		}
		for i, got := range rates {
			if tol := math.Max(0.03*fair[i], 2); math.Abs(got-fair[i]) > tol {
				if bad++; bad <= 5 {
					t.Errorf("second %d: Envoy %d (demand %.0f/s) assigned %.1f/s, max-min fair share %.1f/s", s, i, f.demand[i], got, fair[i])
				}
			}
		}
	}
	var fb int64
	for _, e := range r.envoys {
		fb += e.fallback
	}
	if fb > int64(len(r.envoys)) {
		t.Errorf("%d requests admitted without a live assignment; only each bucket's first request may be", fb)
	}
}

func loadFleetPolicy(t testing.TB, limit int64) *policy.Set {
	t.Helper()
	set, _, err := policy.LoadSources(policy.LoadOptions{}, policy.Source{Name: "fleet.yaml", Data: fmt.Appendf(nil, fleetConfig, limit)})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// unevenDemand is 10 Envoys whose demand sums to 4x the limit, three of
// them below an even share.
func unevenDemand(limit int64) []float64 {
	w := []float64{20, 40, 60, 150, 300, 400, 500, 700, 830, 1000} // sums to 4000
	out := make([]float64, len(w))
	for i, x := range w {
		out[i] = x * float64(limit) / 1000
	}
	return out
}

func fleetDuration() (run, kill time.Duration) {
	if os.Getenv("RATELIMITD_LONG") != "" {
		return 60 * time.Second, 20 * time.Second
	}
	return 30 * time.Second, 10 * time.Second
}

func newReplica(t testing.TB, store Store, demand Demand, clock *fakeClock, name string, set *policy.Set) *Server {
	t.Helper()
	// The rounds and joins of the simulation's clock get real-time budgets
	// a loaded host meets: the bounds are on the division, given a store
	// that answers.
	o := Options{Store: store, Demand: demand, Now: clock.Now, Replica: name, joinTimeout: 30 * time.Second, roundTimeout: 30 * time.Second}
	if l, ok := store.(LeaseStore); ok {
		// The memory and Redis stores lease on the counters Take decides
		// (Redis: window keys), as cmd/ratelimitd sets them.
		o.Leases = l
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	s.SetPolicy(set)
	t.Cleanup(s.Shutdown)
	return s
}

// TestFleetMemory: 10 simulated Envoys, demand unevenly 4x a per-second
// limit, two replicas in one process sharing the memory store, one killed
// a third into the run.
func TestFleetMemory(t *testing.T) {
	const limit = 1000
	clock := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	store, err := memory.New(memory.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	set := loadFleetPolicy(t, limit)
	demand := NewMemory()
	dur, kill := fleetDuration()
	f := &fleetRun{limit: limit, demand: unevenDemand(limit), duration: dur, kill: kill,
		replicas: []*Server{newReplica(t, store, demand, clock, "a", set), newReplica(t, store, demand, clock, "b", set)}}
	f.check(t, f.run(t, clock))
}

// TestFleetRedis: the same fleet against two replicas, each with its own
// Redis store on one redis-server, one killed a third into the run.
func TestFleetRedis(t *testing.T) {
	const limit = 1000
	srv := redistest.Standalone(t)
	clock := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	set := loadFleetPolicy(t, limit)
	newStore := func() *redis.Store {
		o := redis.DefaultOptions()
		o.URL = srv.URL()
		o.Timeout = 2 * time.Second
		o.Now = clock.Now
		s, err := redis.New(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := newStore(), newStore()
	dur, kill := fleetDuration()
	f := &fleetRun{limit: limit, demand: unevenDemand(limit), duration: dur, kill: kill,
		replicas: []*Server{newReplica(t, a, a, clock, "a", set), newReplica(t, b, b, clock, "b", set)}}
	f.check(t, f.run(t, clock))
}
