package redis_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The Redis store is a service.Store.
var _ service.Store = (*redis.Store)(nil)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis' pool keeps background goroutines until Close; every
		// test closes its stores, these are the process-wide ones.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

// pinnedClock is a pinned, manually advanced clock for Options.Now.
type pinnedClock struct {
	mu sync.Mutex
	t  time.Time
}

func newPinnedClock(t time.Time) *pinnedClock { return &pinnedClock{t: t} }

func (c *pinnedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *pinnedClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *pinnedClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newStore returns a Store on srv (nil now: the server's TIME).
func newTestStore(t testing.TB, srv *redistest.Server, now func() time.Time, cacheSize int) *redis.Store {
	t.Helper()
	o := redis.DefaultOptions()
	// take.lua's layout for every kind (window keys off): the tests built
	// on this Store cover it; windowStore covers the default.
	o.WindowKeys = false
	o.URL = srv.URL()
	o.Timeout = 2 * time.Second
	// A call without a deadline may wait this long (its budget) on a
	// starved host: these tests check decisions, not how fast they come.
	o.MaxWait = stateWithin
	o.PoolSize = 8
	o.LocalCacheSize = cacheSize
	o.Now = now
	s := openStore(t, o)
	if cacheSize > 0 { // Warm waits for the cache's credit subscription
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.Warm(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

var epoch0 = time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC)

// allKinds is one limit of every algorithm, 3 units per 10 s.
func allKinds() []algo.Limit {
	p := 10 * time.Second
	return []algo.Limit{
		{Kind: algo.FixedWindow, Rate: 3, Period: p},
		{Kind: algo.SlidingWindow, Rate: 3, Period: p},
		{Kind: algo.SlidingLog, Rate: 3, Period: p},
		{Kind: algo.TokenBucket, Rate: 3, Period: p},
		{Kind: algo.Concurrency, Rate: 3, Period: p},
		{Kind: algo.FixedWindow, Rate: 3, Calendar: algo.CalendarMonth, Multiplier: 1, Period: 30 * 24 * time.Hour},
	}
}

// kindName is algotest.KindName of l's algorithm, with "_calendar" for a
// calendar window.
func kindName(l algo.Limit) string {
	n := algotest.KindName(l.Kind)
	if l.Calendar != algo.CalendarNone {
		n += "_calendar"
	}
	return n
}

func scanKeys(t testing.TB, c *goredis.Client) []string {
	t.Helper()
	var out []string
	iter := c.Scan(context.Background(), 0, "*", 100).Iterator()
	for iter.Next(context.Background()) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scan: %v", err)
	}
	return out
}

// TestAllOrNothing: a request whose last hit denies writes no key at all,
// for every algorithm, and reports the values before the request.
func TestAllOrNothing(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	for _, l := range allKinds() {
		t.Run(kindName(l), func(t *testing.T) {
			c := srv.Client()
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			clk := newPinnedClock(epoch0)
			s := newTestStore(t, srv, clk.Now, 0)
			blocker := algo.Hit{Key: "blocker", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}, Cost: 1}
			if _, err := algotest.Take(ctx, s, []algo.Hit{blocker}); err != nil {
				t.Fatal(err)
			}
			before := scanKeys(t, c)
			hits := []algo.Hit{{Key: "k", Limit: l, Cost: 2}, blocker}
			d, err := algotest.Take(ctx, s, hits)
			if err != nil {
				t.Fatal(err)
			}
			if d[1].Allowed || !d[0].Allowed {
				t.Fatalf("decisions %+v: want hit 0 allowed (it did not deny) and hit 1 denied", d)
			}
			if d[0].Remaining != 3 {
				t.Errorf("remaining of the non-denying hit = %d, want 3 (value before the request)", d[0].Remaining)
			}
			if after := scanKeys(t, c); strings.Join(after, ",") != strings.Join(before, ",") {
				t.Errorf("keys after denied request %v, before %v: a denied request wrote", after, before)
			}
			// The full cost is still available.
			d, err = algotest.Take(ctx, s, []algo.Hit{{Key: "k", Limit: l, Cost: 3}})
			if err != nil {
				t.Fatal(err)
			}
			if !d[0].Allowed || d[0].Remaining != 0 {
				t.Errorf("after the denied request, cost 3 gave %+v; want allowed with 0 remaining", d[0])
			}
		})
	}
}

// TestNoScript: the script cache flushed between two calls (a Redis
// restart or failover) is reloaded transparently.
func TestNoScript(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	s := newTestStore(t, srv, newPinnedClock(epoch0).Now, 0)
	h := []algo.Hit{{Key: "ns", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}, Cost: 1}}
	for i := range 3 {
		if i == 1 {
			if err := srv.Client().ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		d, err := algotest.Take(ctx, s, h)
		if err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
		if want := int64(4 - i); d[0].Remaining != want {
			t.Fatalf("take %d: remaining %d, want %d", i, d[0].Remaining, want)
		}
	}
}

// TestSharedExactness: three Stores on one Redis, 60 concurrent calls on a
// 30/minute key, with the server's clock: exactly 30 are allowed.
func TestSharedExactness(t *testing.T) {
	srv := redistest.Standalone(t)
	stores := []*redis.Store{newTestStore(t, srv, nil, 0), newTestStore(t, srv, nil, 0), newTestStore(t, srv, nil, 0)}
	for _, kind := range []algo.Kind{algo.FixedWindow, algo.SlidingLog, algo.TokenBucket} {
		l := algo.Limit{Kind: kind, Rate: 30, Period: time.Minute}
		t.Run(kindName(l), func(t *testing.T) {
			if kind == algo.FixedWindow {
				// Stay clear of a minute boundary (the window resets there).
				if s := time.Now().Second(); s >= 55 {
					time.Sleep(time.Duration(61-s) * time.Second)
				}
			}
			if n := concurrentAllowed(t, stores, "shared:"+kindName(l), l, 60); n != 30 {
				t.Fatalf("allowed %d of 60, want exactly 30", n)
			}
		})
	}
}

// TestSameKeyTwice: two hits on one key in one request are applied in
// order, the second seeing the first.
func TestSameKeyTwice(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	for _, l := range allKinds() {
		t.Run(kindName(l), func(t *testing.T) {
			s := newTestStore(t, srv, newPinnedClock(epoch0).Now, 0)
			key := "twice:" + kindName(l)
			d, err := algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}, {Key: key, Limit: l, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if !d[0].Allowed || !d[1].Allowed || d[0].Remaining != 2 || d[1].Remaining != 1 {
				t.Fatalf("decisions %+v, want remaining 2 then 1", d)
			}
			d, err = algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}, {Key: key, Limit: l, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if !d[0].Allowed || d[1].Allowed {
				t.Fatalf("decisions %+v, want the first allowed and the second denied", d)
			}
			d, err = algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if !d[0].Allowed || d[0].Remaining != 0 {
				t.Fatalf("after the denied pair: %+v, want allowed with 0 remaining (the pair consumed nothing)", d[0])
			}
		})
	}
}

// TestMemoryUsage measures MEMORY USAGE (bytes, Redis 7, jemalloc) of one
// key per algorithm with a 22-byte key (policy.Set.Key's hashed form) and
// logs the table reproduced in BENCHMARKS.md:
//
//	go test ./pkg/backend/redis -run TestMemoryUsage -v
func TestMemoryUsage(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	c := srv.Client()
	s := newTestStore(t, srv, newPinnedClock(epoch0).Now, 0)
	const key = "AAECAwQFBgcICQoLDA0ODw" // 22 bytes, like a hashed policy key
	cases := []struct {
		name  string
		limit algo.Limit
		takes int // hits of cost 1
	}{
		{"fixed_window", algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Minute}, 1},
		{"sliding_window", algo.Limit{Kind: algo.SlidingWindow, Rate: 1000, Period: time.Minute}, 1},
		{"token_bucket", algo.Limit{Kind: algo.TokenBucket, Rate: 1000, Period: time.Minute}, 1},
		{"sliding_log, 1 entry", algo.Limit{Kind: algo.SlidingLog, Rate: 1000, Period: time.Minute}, 1},
		{"sliding_log, 100 entries", algo.Limit{Kind: algo.SlidingLog, Rate: 1000, Period: time.Minute}, 100},
		{"sliding_log, 1000 entries", algo.Limit{Kind: algo.SlidingLog, Rate: 1000, Period: time.Minute}, 1000},
		{"concurrency, 1 lease", algo.Limit{Kind: algo.Concurrency, Rate: 1000, Period: time.Minute}, 1},
		{"concurrency, 100 leases", algo.Limit{Kind: algo.Concurrency, Rate: 1000, Period: time.Minute}, 100},
	}
	var prev int64
	for i, tc := range cases {
		if err := c.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for range tc.takes {
			if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: tc.limit, Cost: 1}}); err != nil {
				t.Fatal(err)
			}
		}
		n, err := c.MemoryUsage(ctx, key, 0).Result() // SAMPLES 0: every element
		if err != nil {
			t.Fatal(err)
		}
		if n <= int64(len(key)) {
			t.Errorf("%s: MEMORY USAGE %d bytes, not plausible", tc.name, n)
		}
		if i > 0 && cases[i-1].limit.Kind == tc.limit.Kind && n <= prev {
			t.Errorf("%s: %d bytes, not more than with fewer entries (%d)", tc.name, n, prev)
		}
		prev = n
		t.Logf("| %-26s | %6d |", tc.name, n)
	}
}

// BenchmarkTake measures Store.Take (one hit, token bucket 1000/s, server
// clock) against a real redis-server, from parallel goroutines over 10,000
// keys; all goroutines share the Store's pool:
//
//	go test ./pkg/backend/redis -run '^$' -bench Take -benchtime 5s
func BenchmarkTake(b *testing.B) {
	srv := redistest.Standalone(b)
	for _, kind := range []algo.Kind{algo.FixedWindow, algo.TokenBucket, algo.SlidingWindow, algo.SlidingLog} {
		b.Run(kindName(algo.Limit{Kind: kind}), func(b *testing.B) {
			s := newTestStore(b, srv, nil, 0)
			l := algo.Limit{Kind: kind, Rate: 1000, Period: time.Second}
			keys := make([]string, 10_000)
			for i := range keys {
				keys[i] = fmt.Sprintf("bench:%d:%d", kind, i)
			}
			var seq atomic.Uint64
			b.SetParallelism(8) // 8 × GOMAXPROCS concurrent callers
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					k := keys[seq.Add(1)%uint64(len(keys))]
					if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: k, Limit: l, Cost: 1}}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestSentinelStore: Store.Take through Sentinel (with the autopipeliner)
// keeps deciding after the master is killed and a replica promoted: errors
// stop within seconds of the promotion.
func TestSentinelStore(t *testing.T) {
	if testing.Short() {
		t.Skip("sentinel: -short")
	}
	g := redistest.Sentinel(t)
	o := redis.DefaultOptions()
	o.Mode, o.URL, o.Addrs, o.MasterName = redis.Sentinel, "", g.SentinelAddrs(), redistest.MasterName
	o.Timeout = 50 * time.Millisecond
	s := openStore(t, o)
	ctx := context.Background()
	h := []algo.Hit{{Key: "sentinel", Limit: algo.Limit{Kind: algo.TokenBucket, Rate: 1 << 30, Period: time.Second}, Cost: 1}}
	okWithin := func(limit time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		var last error
		for time.Since(start) < limit {
			if _, last = algotest.Take(ctx, s, h); last == nil {
				// require a quiet stretch: 20 consecutive successes
				ok := true
				for range 20 {
					if _, last = algotest.Take(ctx, s, h); last != nil {
						ok = false
						break
					}
				}
				if ok {
					return time.Since(start)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no stable decisions within %v: %v", limit, last)
		return 0
	}
	okWithin(stateWithin)
	old := g.KillMaster()
	g.WaitFailover(old, redistest.FailoverWithin)
	d := okWithin(stateWithin)
	t.Logf("decisions stable %v after the promotion", d)
}

// TestSoftHit: a denied Soft hit (shadow or quota mode) does not roll back
// the request's other hits and writes nothing itself; on a cluster too.
func TestSoftHit(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	s := newTestStore(t, srv, newPinnedClock(epoch0).Now, 0)
	one := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	three := algo.Limit{Kind: algo.TokenBucket, Rate: 3, Period: time.Hour}
	steps := []struct {
		hits []algo.Hit
		want []bool  // Allowed
		rem  []int64 // Remaining
	}{
		{[]algo.Hit{{Key: "soft", Limit: one, Cost: 1, Soft: true}, {Key: "hard", Limit: three, Cost: 1}}, []bool{true, true}, []int64{0, 2}},
		{[]algo.Hit{{Key: "soft", Limit: one, Cost: 1, Soft: true}, {Key: "hard", Limit: three, Cost: 1}}, []bool{false, true}, []int64{0, 1}},
		{[]algo.Hit{{Key: "soft", Limit: one, Cost: 1}, {Key: "hard", Limit: three, Cost: 1}}, []bool{false, true}, []int64{0, 1}}, // not soft: rolled back
		{[]algo.Hit{{Key: "hard", Limit: three, Cost: 1}}, []bool{true}, []int64{0}},
	}
	for i, st := range steps {
		d, err := algotest.Take(ctx, s, st.hits)
		if err != nil {
			t.Fatal(err)
		}
		for j := range d {
			if d[j].Allowed != st.want[j] || d[j].Remaining != st.rem[j] {
				t.Errorf("step %d hit %d: %+v, want allowed=%v remaining=%d", i, j, d[j], st.want[j], st.rem[j])
			}
		}
	}
}

// TestSlidingLogLargeCost: a request may add up to MaxSlidingLogRate log
// entries at once (one per unit of cost); the script must not hit Lua's
// unpack limit, and must agree with pkg/algo.
func TestSlidingLogLargeCost(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	clock := newPinnedClock(epoch0)
	s := newTestStore(t, srv, clock.Now, 0)
	l := algo.Limit{Kind: algo.SlidingLog, Rate: algo.MaxSlidingLogRate, Period: time.Minute}
	var st algo.State
	for i, cost := range []int64{4000, 3999, 2001, 1, 1} {
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: "biglog", Limit: l, Cost: cost}})
		if err != nil {
			t.Fatalf("step %d cost %d: %v", i, cost, err)
		}
		var want algo.Decision
		st, want = algo.Take(l, st, clock.Now(), cost)
		if d[0] != want {
			t.Errorf("step %d cost %d: redis %+v, algo %+v", i, cost, d[0], want)
		}
		clock.Advance(time.Second)
	}
	if n := srv.Client().ZCard(ctx, "biglog").Val(); n != algo.MaxSlidingLogRate {
		t.Errorf("log holds %d entries, want %d", n, algo.MaxSlidingLogRate)
	}
}

// concurrentAllowed sends n concurrent one-hit requests on key, spread
// round-robin over stores, and returns how many were allowed
// (algotest.ConcurrentAllowed). Any error fails the test.
func concurrentAllowed(t *testing.T, stores []*redis.Store, key string, l algo.Limit, n int) int64 {
	t.Helper()
	allowed, err := algotest.ConcurrentAllowed(context.Background(), stores, key, l, n)
	if err != nil {
		t.Fatal(err)
	}
	return allowed
}
