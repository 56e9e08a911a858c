package redis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// crossSlotStore is a Store on g whose calls are never cut short by
// scheduling delay (every call in these bursts gets Redis' answer).
func crossSlotStore(t *testing.T, g *redistest.ClusterGroup) *redis.Store {
	t.Helper()
	o := redis.DefaultOptions()
	o.Mode = redis.Cluster
	o.URL = ""
	o.Addrs = g.Addrs()
	o.Timeout = 5 * time.Second
	o.MaxWait = 20 * time.Second
	o.DialTimeout = 5 * time.Second
	return openStore(t, o)
}

// crossSlotTally is what a mixed burst admitted.
type crossSlotTally struct {
	both, bOnly int // admitted requests of each shape
}

// crossSlotBurst runs, all released at once, nBoth requests with a hit on
// a and a hit on b (keys of different masters; half of them list b first)
// and nBOnly requests with the hit on b alone, spread round-robin over
// stores. Every call must be decided (no error).
func crossSlotBurst(t *testing.T, stores []*redis.Store, a, b algo.Hit, nBoth, nBOnly int) crossSlotTally {
	t.Helper()
	var (
		mu    sync.Mutex
		tally crossSlotTally
		errs  []error
		wg    sync.WaitGroup
	)
	start := make(chan struct{})
	for i := range nBoth + nBOnly {
		s := stores[i%len(stores)]
		// the two shapes evenly interleaved, nBoth of the first
		both := (i+1)*nBoth/(nBoth+nBOnly) > i*nBoth/(nBoth+nBOnly)
		hits := []algo.Hit{b}
		if both {
			hits = []algo.Hit{a, b}
			if i%4 == 0 {
				hits = []algo.Hit{b, a}
			}
		}
		wg.Go(func() {
			<-start
			d, err := algotest.Take(context.Background(), s, hits)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			allowed := true
			for _, x := range d {
				allowed = allowed && x.Allowed
			}
			switch {
			case !allowed:
			case both:
				tally.both++
			default:
				tally.bOnly++
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d calls of the burst failed, first: %v", len(errs), errs[0])
	}
	return tally
}

// consumed is what key holds of l: a check, l's capacity less its
// remaining.
func consumed(t *testing.T, s *redis.Store, key string, l algo.Limit) int64 {
	t.Helper()
	d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: key, Limit: l, Cost: 0}})
	if err != nil {
		t.Fatalf("check of %s: %v", key, err)
	}
	return l.Rate - d[0].Remaining
}

// TestClusterCrossSlotUnderAdmission: on a 3-master Cluster with three
// Stores, a burst mixes two-slot requests (a hit on A and one on B, on two
// masters) with enough requests on B alone to use all of B. A perfect
// limiter ends the burst with B full, so what B has left once every refund
// has run was denied to B's requests while two-slot requests that A denied
// held it. In every round that is under 10 % of B's free capacity, nothing
// is over-admitted, and both counters end exact.
//
// Scenarios, with A the smaller limit (a per-client limit next to a shared
// one): A exhausted before the burst, and A with a little room. With A the
// larger limit, exhausted, the Stores learn it from a first burst, which is
// not held to the bound (until a Store has seen A deny, its two-slot
// requests hold B until A denies).
func TestClusterCrossSlotUnderAdmission(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	const (
		rounds = 5
		bRate  = 60
		nBoth  = 120
		nBOnly = bRate
		bound  = 0.10
	)
	g := redistest.Cluster(t, 3)
	keys := slotKeys("xsu", 2) // different masters
	for _, sc := range []struct {
		name  string
		aRate int64
		aUsed int64 // A's consumption before the burst
		learn bool  // a first burst on another B teaches the Stores that A denies
	}{
		{"A exhausted", 4, 4, false},
		{"A with room", 4, 0, false},
		{"A larger, exhausted", 1000, 1000, true},
	} {
		t.Run(sc.name, func(t *testing.T) {
			stores := []*redis.Store{crossSlotStore(t, g), crossSlotStore(t, g), crossSlotStore(t, g)}
			filler := crossSlotStore(t, g) // fills A and reads the counters: the burst's Stores learn nothing from it
			la := algo.Limit{Kind: algo.FixedWindow, Rate: sc.aRate, Period: time.Hour}
			lb := algo.Limit{Kind: algo.FixedWindow, Rate: bRate, Period: time.Hour}
			// burst runs the mixed burst on ka and kb, checks that it
			// admitted no more than the limits and left both counters
			// exact, and returns the share of kb's capacity left unused.
			burst := func(r int, what, ka, kb string) float64 {
				usedA0 := consumed(t, filler, ka, la)
				got := crossSlotBurst(t, stores, algo.Hit{Key: ka, Limit: la, Cost: 1}, algo.Hit{Key: kb, Limit: lb, Cost: 1}, nBoth, nBOnly)
				for _, s := range stores { // every compensating refund has run
					s.WaitRefunds()
				}
				usedA, usedB := consumed(t, filler, ka, la), consumed(t, filler, kb, lb)
				if int64(got.both) > sc.aRate-usedA0 || usedB > bRate {
					t.Errorf("round %d, %s: over-admitted: %d two-slot requests admitted with %d free on A; B holds %d of %d",
						r, what, got.both, sc.aRate-usedA0, usedB, bRate)
				}
				if usedA != usedA0+int64(got.both) || usedB != int64(got.both+got.bOnly) {
					t.Errorf("round %d, %s: counters not exact: A holds %d, want %d; B holds %d, want %d",
						r, what, usedA, usedA0+int64(got.both), usedB, got.both+got.bOnly)
				}
				under := float64(bRate-usedB) / bRate
				t.Logf("round %d, %s: admitted %d of %d two-slot and %d of %d B-only requests; B ends at %d of %d: %.0f %% of its free capacity denied",
					r, what, got.both, nBoth, got.bOnly, nBOnly, usedB, bRate, 100*under)
				return under
			}
			worst, worstFirst := 0.0, 0.0
			for r := range rounds {
				ka := fmt.Sprintf("%s:%s:%d:a", keys[0], sc.name, r)
				kb := fmt.Sprintf("%s:%s:%d:b", keys[1], sc.name, r)
				if redis.Slot(ka) == redis.Slot(kb) {
					t.Fatalf("%s and %s share a slot", ka, kb)
				}
				if sc.aUsed > 0 {
					if d, err := algotest.Take(context.Background(), filler, []algo.Hit{{Key: ka, Limit: la, Cost: sc.aUsed}}); err != nil || !d[0].Allowed {
						t.Fatalf("filling A: %v %v", d, err)
					}
				}
				if sc.learn {
					worstFirst = max(worstFirst, burst(r, "first burst", ka, kb+":first"))
				}
				worst = max(worst, burst(r, "burst", ka, kb))
			}
			if sc.learn {
				t.Logf("%s: worst under-admission of the first bursts %.0f %% of B's free capacity", sc.name, 100*worstFirst)
			}
			t.Logf("%s: worst under-admission %.0f %% of B's free capacity over %d rounds", sc.name, 100*worst, rounds)
			if worst >= bound {
				t.Errorf("%s: up to %.0f %% of B's free capacity denied, want under %.0f %%", sc.name, 100*worst, 100*bound)
			}
		})
	}
}

// BenchmarkClusterCrossSlot is the latency of one request of two hits on
// a 3-master Cluster, one caller at a time: both keys in one slot (a hash
// tag), on two masters and admitted, and on two masters and denied by
// the exhausted one.
//
//	RATELIMITD_REQUIRE_REDIS=1 go test -run XXX -bench ClusterCrossSlot ./pkg/backend/redis/
func BenchmarkClusterCrossSlot(b *testing.B) {
	g := redistest.Cluster(b, 3)
	o := redis.DefaultOptions()
	o.Mode = redis.Cluster
	o.URL = ""
	o.Addrs = g.Addrs()
	o.Timeout = 5 * time.Second
	o.MaxWait = 20 * time.Second
	s, err := redis.New(o)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	big := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 40, Period: time.Hour}
	small := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	keys := slotKeys("xsb", 2)
	if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: keys[0] + ":full", Limit: small, Cost: 1}}); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name    string
		hits    []algo.Hit
		allowed bool
	}{
		{"one slot", []algo.Hit{{Key: "{xsb}:a", Limit: big, Cost: 1}, {Key: "{xsb}:b", Limit: big, Cost: 1}}, true},
		{"two slots admitted", []algo.Hit{{Key: keys[0], Limit: big, Cost: 1}, {Key: keys[1], Limit: big, Cost: 1}}, true},
		{"two slots denied", []algo.Hit{{Key: keys[0] + ":full", Limit: small, Cost: 1}, {Key: keys[1], Limit: big, Cost: 1}}, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				d, err := algotest.Take(ctx, s, bc.hits)
				if err != nil || d[0].Allowed != bc.allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
		})
	}
}
