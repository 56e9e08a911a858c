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

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// windowStore is newTestStore with Options.WindowKeys, and budgets for a
// loaded host.
func windowStore(t testing.TB, srv *redistest.Server, now func() time.Time) *redis.Store {
	t.Helper()
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 5 * time.Second
	o.MaxWait = 10 * time.Second
	o.PoolSize = 8
	o.Now = now
	o.WindowKeys = true
	return openStore(t, o)
}

// windowTables are the conformance tables of pkg/algo with window keys:
// a table with an epoch-aligned fixed_window or sliding_window hit stops
// before a step
// whose clock went back into an earlier window (with one key per window
// the count of the window the clock names is used, as the memcached
// backend and envoyproxy/ratelimit do; take.lua keeps counting in the
// later window).
func windowTables(t *testing.T) []algotest.Table {
	var out []algotest.Table
	cut := 0
	for _, tb := range algotest.Tables() {
		fixed := false
		for _, st := range tb.Steps {
			for _, h := range st.Hits {
				k := h.Limit.Kind
				fixed = fixed || (k == algo.FixedWindow || k == algo.SlidingWindow) && h.Limit.Calendar == algo.CalendarNone
			}
		}
		steps := tb.Steps
		var last time.Time
		for i, st := range tb.Steps {
			at := algotest.Base.Add(st.At)
			if !st.Abs.IsZero() {
				at = st.Abs
			}
			if fixed && at.Before(last) {
				steps = tb.Steps[:i]
				cut++
				break
			}
			last = at
		}
		out = append(out, algotest.Table{Name: tb.Name, Steps: steps})
	}
	if cut == 0 || cut > 5 {
		t.Fatalf("%d tables cut at a clock going back, want 1 to 5", cut)
	}
	return out
}

// TestConformanceWindowKeys runs the shared conformance tables with
// fixed windows counted under window keys (the other kinds, and requests
// mixing them, as usual).
func TestConformanceWindowKeys(t *testing.T) {
	srv := redistest.Standalone(t)
	algotest.RunTables(t, windowTables(t), func(t *testing.T, now func() time.Time) algotest.Store {
		return windowStore(t, srv, now)
	})
}

// TestConformanceClusterWindowKeys is TestConformanceWindowKeys through a
// 3-master Redis Cluster.
func TestConformanceClusterWindowKeys(t *testing.T) {
	g := redistest.Cluster(t, 3)
	algotest.RunTables(t, windowTables(t), func(t *testing.T, now func() time.Time) algotest.Store {
		o := redis.DefaultOptions()
		o.Mode = redis.Cluster
		o.URL = ""
		o.Addrs = g.Addrs()
		o.Timeout = 2 * time.Second
		o.DialTimeout = 2 * time.Second
		o.MaxWait = stateWithin // as newClusterStore
		o.PoolSize = 8
		o.Now = now
		o.WindowKeys = true
		return openStore(t, o)
	})
}

// TestWindowKeysLayout checks the key, value and TTL a window-key take
// leaves, with the server's clock.
func TestWindowKeysLayout(t *testing.T) {
	srv := redistest.Standalone(t)
	s := windowStore(t, srv, nil)
	ctx := context.Background()
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Hour}
	for _, base := range []string{"wk:plain", "{rl}:wk:tagged"} {
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: base, Limit: l, Cost: 2}})
		if err != nil {
			t.Fatal(err)
		}
		if !d[0].Allowed || d[0].Remaining != 3 {
			t.Fatalf("%s: %+v, want allowed with 3 remaining", base, d[0])
		}
		keys, err := c.Keys(ctx, "*wk:"+strings.TrimPrefix(strings.TrimPrefix(base, "{rl}:wk:"), "wk:")+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 {
			t.Fatalf("%s: keys %q, want one window key", base, keys)
		}
		k := keys[0]
		if redis.Slot(k) != redis.Slot(base) {
			t.Errorf("%s: window key %s hashes to slot %d, the base to %d", base, k, redis.Slot(k), redis.Slot(base))
		}
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ws := tm.UnixMicro() - tm.UnixMicro()%time.Hour.Microseconds()
		want := fmt.Sprintf("{%s}:v2:%d", base, ws)
		if strings.HasPrefix(base, "{") {
			want = fmt.Sprintf("%s:v2:%d", base, ws)
		}
		if k != want {
			t.Errorf("window key %q, want %q", k, want)
		}
		if v, _ := c.Get(ctx, k).Result(); v != "2" {
			t.Errorf("%s holds %q, want 2", k, v)
		}
		ttl, _ := c.PTTL(ctx, k).Result()
		if ttl <= 0 || ttl < d[0].ResetAfter || ttl > time.Hour+time.Second+2*time.Millisecond {
			t.Errorf("%s PTTL %v, want in [ResetAfter %v, 1 h + 1 s]", k, ttl, d[0].ResetAfter)
		}
		// A denial leaves the count as it was.
		d, err = algotest.Take(ctx, s, []algo.Hit{{Key: base, Limit: l, Cost: 4}})
		if err != nil {
			t.Fatal(err)
		}
		if d[0].Allowed || d[0].Remaining != 3 || d[0].RetryAfter <= 0 {
			t.Errorf("%s over: %+v, want denied, 3 remaining, a RetryAfter", base, d[0])
		}
		if v, _ := c.Get(ctx, k).Result(); v != "2" {
			t.Errorf("%s holds %q after a denial, want 2", k, v)
		}
	}
	// A first hit that denies creates nothing.
	if d, err := algotest.Take(ctx, s, []algo.Hit{{Key: "wk:big", Limit: l, Cost: 6}}); err != nil || d[0].Allowed {
		t.Fatalf("cost above the rate: %+v %v, want denied", d, err)
	}
	if keys, _ := c.Keys(ctx, "*wk:big*").Result(); len(keys) != 0 {
		t.Errorf("a denied first hit left %q", keys)
	}
}

// TestWindowKeysExact: several Stores, many goroutines, one key: exactly
// the limit is admitted, with the server's clock.
func TestWindowKeysExact(t *testing.T) {
	srv := redistest.Standalone(t)
	stores := []*redis.Store{windowStore(t, srv, nil), windowStore(t, srv, nil), windowStore(t, srv, nil)}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 40, Period: time.Hour}
	if n := concurrentAllowed(t, stores, "wk:shared", l, 120); n != 40 {
		t.Fatalf("allowed %d of 120, want exactly 40", n)
	}
}

// TestWindowKeysSkew: Stores whose estimate of the server's clock is off
// by a window or more either way still count in the server's window
// (their keys are refused and sent again), so together they admit
// exactly the limit.
func TestWindowKeysSkew(t *testing.T) {
	srv := redistest.Standalone(t)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 30, Period: time.Hour}
	offsets := []time.Duration{0, -90 * time.Minute, 3 * time.Hour, 59 * time.Minute}
	var stores []*redis.Store
	for _, off := range offsets {
		s := windowStore(t, srv, nil)
		s.SetServerOffset(off.Microseconds())
		stores = append(stores, s)
	}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		s := stores[i%len(stores)]
		if i < len(stores) {
			s.SetServerOffset(offsets[i].Microseconds())
		}
		wg.Go(func() {
			d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "wk:skew", Limit: l, Cost: 1}})
			if err != nil {
				errs <- err
				return
			}
			if d[0].Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := allowed.Load(); n != 30 {
		t.Fatalf("allowed %d of 100 across skewed Stores, want exactly 30", n)
	}
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	if keys, _ := c.Keys(context.Background(), "*wk:skew*").Result(); len(keys) != 1 {
		t.Errorf("keys %q, want the server's window only", keys)
	}
}

// TestWindowKeysMixedAllOrNothing: a request mixing a window-key limit
// with a token bucket on a standalone server is two script calls, still
// all-or-nothing whichever of them denies.
func TestWindowKeysMixedAllOrNothing(t *testing.T) {
	srv := redistest.Standalone(t)
	s := windowStore(t, srv, nil)
	ctx := context.Background()
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Hour}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 3, Period: time.Hour}
	take := func(hits ...algo.Hit) []algo.Decision {
		t.Helper()
		d, err := algotest.Take(ctx, s, hits)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// The token bucket denies: the window key is not charged.
	take(algo.Hit{Key: "mx:tb", Limit: tb, Cost: 3})
	d := take(algo.Hit{Key: "mx:fw", Limit: fw, Cost: 1}, algo.Hit{Key: "mx:tb", Limit: tb, Cost: 1})
	if !d[0].Allowed || d[0].Remaining != 3 || d[1].Allowed {
		t.Fatalf("bucket empty: %+v, want the window hit reporting 3 left and the bucket denied", d)
	}
	if d := take(algo.Hit{Key: "mx:fw", Limit: fw, Cost: 0}); d[0].Remaining != 3 {
		t.Fatalf("window after a denied mixed request: %+v, want 3 left", d[0])
	}
	// The window denies: the bucket is not charged.
	take(algo.Hit{Key: "mx:fw2", Limit: fw, Cost: 3})
	d = take(algo.Hit{Key: "mx:fw2", Limit: fw, Cost: 1}, algo.Hit{Key: "mx:tb2", Limit: tb, Cost: 2})
	if d[0].Allowed || !d[1].Allowed || d[1].Remaining != 3 {
		t.Fatalf("window full: %+v, want the window denied and the bucket reporting 3 left", d)
	}
	if d := take(algo.Hit{Key: "mx:tb2", Limit: tb, Cost: 0}); d[0].Remaining != 3 {
		t.Fatalf("bucket after a denied mixed request: %+v, want 3 left", d[0])
	}
	// Both allow: both are charged.
	d = take(algo.Hit{Key: "mx:fw3", Limit: fw, Cost: 1}, algo.Hit{Key: "mx:tb3", Limit: tb, Cost: 2})
	if !d[0].Allowed || d[0].Remaining != 2 || !d[1].Allowed || d[1].Remaining != 1 {
		t.Fatalf("both allow: %+v, want 2 and 1 left", d)
	}
}

// TestWindowKeysShareInvocation: concurrent window-key requests from
// many goroutines go out as far fewer script calls than requests, and
// each is still counted exactly.
func TestWindowKeysShareInvocation(t *testing.T) {
	srv := redistest.Standalone(t)
	s := windowStore(t, srv, nil)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "sh:warm", Limit: l, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 400
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for i := range n {
		wg.Go(func() {
			d, err := algotest.Take(ctx, s, []algo.Hit{{Key: fmt.Sprintf("sh:%d", i%50), Limit: l, Cost: 1}})
			if err == nil && d[0].Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != n {
		t.Fatalf("allowed %d of %d", allowed.Load(), n)
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := int64(0)
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:calls=") || strings.HasPrefix(line, "cmdstat_eval:calls=") {
			v, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(line, "cmdstat_evalsha:calls="), "cmdstat_eval:calls="), ",")
			var k int64
			fmt.Sscan(v, &k)
			calls += k
		}
	}
	if calls < 1 || calls >= n {
		t.Fatalf("%d script calls for %d requests, want fewer", calls, n)
	}
	for i := range 50 {
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: fmt.Sprintf("sh:%d", i), Limit: l, Cost: 0}})
		if err != nil || d[0].Remaining != 1000-n/50 {
			t.Fatalf("sh:%d: %+v %v, want %d left", i, d, err, 1000-n/50)
		}
	}
}

// TestWindowKeysNoTime: window-key decisions read the server's TIME only
// in the calls that check the estimate of its clock, one per second per
// master (and the first), not one per call; after Warm the others are
// FCALLs of the function library, with no EVAL.
func TestWindowKeysNoTime(t *testing.T) {
	srv := redistest.Standalone(t)
	s := windowStore(t, srv, nil)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil { // loads the function library
		t.Fatal(err)
	}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1_000_000, Period: time.Hour}
	// Two takes load both scripts: the first checks the clock
	// (window.lua), the second is a lone decision (window1.lua).
	for range 2 {
		if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "nt:warm", Limit: l, Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 300
	start := time.Now()
	for i := range n {
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: fmt.Sprintf("nt:%d", i%30), Limit: l, Cost: 1}})
		if err != nil || !d[0].Allowed {
			t.Fatalf("take %d: %+v %v", i, d, err)
		}
	}
	elapsed := time.Since(start)
	stats := commandCalls(t, c)
	if calls := stats["evalsha"] + stats["eval"] + stats["fcall"]; calls != n {
		t.Fatalf("%d script and function calls for %d sequential requests", calls, n)
	}
	// A lone decision is an FCALL; only the calls that check the clock
	// (and read TIME) go to window.lua.
	if stats["eval"] != 0 || stats["evalsha"] > stats["time"] {
		t.Fatalf("commandstats %v: want FCALL for every decision that does not read TIME", stats)
	}
	if max := 1 + int64(elapsed/time.Second); stats["time"] > max {
		t.Fatalf("TIME read %d times in %d decisions over %v, want at most %d (one check per second)", stats["time"], n, elapsed, max)
	}
	for i := range 30 {
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: fmt.Sprintf("nt:%d", i), Limit: l, Cost: 0}})
		if err != nil || d[0].Remaining != l.Rate-n/30 {
			t.Fatalf("nt:%d: %+v %v, want %d left", i, d, err, l.Rate-n/30)
		}
	}
}

// commandCalls is INFO commandstats as calls per command.
func commandCalls(t *testing.T, c interface {
	Info(context.Context, ...string) *goredis.StringCmd
}) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		var k int64
		fmt.Sscan(v, &k)
		out[strings.TrimPrefix(name, "cmdstat_")] = k
	}
	return out
}
