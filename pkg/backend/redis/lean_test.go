package redis_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestLeanExact: three Stores with window keys, many goroutines, one fresh
// key: exactly the limit is admitted for a sliding window and a token
// bucket (lean.lua), with the server's clock, and for a request holding
// both (all-or-nothing in one call).
func TestLeanExact(t *testing.T) {
	srv := redistest.Standalone(t)
	stores := []*redis.Store{windowStore(t, srv, nil), windowStore(t, srv, nil), windowStore(t, srv, nil)}
	for _, l := range []algo.Limit{
		{Kind: algo.SlidingWindow, Rate: 40, Period: time.Hour},
		{Kind: algo.TokenBucket, Rate: 40, Period: time.Hour},
		{Kind: algo.TokenBucket, Rate: 7, Burst: 40, Period: time.Hour}, // T has a fraction
	} {
		t.Run(fmt.Sprintf("%s_%d_%d", kindName(l), l.Rate, l.Burst), func(t *testing.T) {
			if n := concurrentAllowed(t, stores, "lean:shared:"+t.Name(), l, 150); n != 40 {
				t.Fatalf("allowed %d of 150, want exactly 40", n)
			}
		})
	}
	t.Run("both", func(t *testing.T) {
		// A sliding window of 30 and a token bucket of 50 on every
		// request: 30 are admitted, and the bucket is charged for those
		// only (the bucket's hit of a denied request reports a check).
		sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 30, Period: time.Hour}
		tb := algo.Limit{Kind: algo.TokenBucket, Rate: 50, Period: time.Hour}
		var allowed atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, 150)
		for i := range 150 {
			s := stores[i%len(stores)]
			wg.Go(func() {
				<-start
				d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "lean:both:sw", Limit: sw, Cost: 1}, {Key: "lean:both:tb", Limit: tb, Cost: 1}})
				if err != nil {
					errs <- err
					return
				}
				if !d[1].Allowed {
					errs <- fmt.Errorf("decisions %+v: the bucket of 50 denied", d)
				}
				if d[0].Allowed {
					allowed.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := allowed.Load(); n != 30 {
			t.Fatalf("allowed %d of 150, want exactly 30", n)
		}
		d, err := algotest.Take(context.Background(), stores[0], []algo.Hit{{Key: "lean:both:tb", Limit: tb, Cost: 0}})
		if err != nil {
			t.Fatal(err)
		}
		if d[0].Remaining != 20 {
			t.Errorf("bucket remaining %d after 30 admitted requests, want 20", d[0].Remaining)
		}
	})
}

// TestLeanLayout checks the keys, values and TTLs lean.lua leaves, with
// the server's clock: a sliding window counts in "{<key>}:v2s:<window
// start>" (two periods of TTL, set when created), a token bucket keeps
// its TAT in µs in "{<key>}:v2g"; a denial writes nothing; a key with a
// hash tag keeps it.
func TestLeanLayout(t *testing.T) {
	srv := redistest.Standalone(t)
	s := windowStore(t, srv, nil)
	ctx := context.Background()
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 5, Period: time.Hour}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 5, Period: time.Hour} // T = 12 min
	for _, base := range []string{"lk:plain", "{rl}:lk:tagged"} {
		wrap := "{" + base + "}"
		if strings.HasPrefix(base, "{") {
			wrap = base
		}
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: base + ":s", Limit: sw, Cost: 2}, {Key: base + ":t", Limit: tb, Cost: 2}})
		if err != nil {
			t.Fatal(err)
		}
		if !d[0].Allowed || d[0].Remaining != 3 || !d[1].Allowed || d[1].Remaining != 3 {
			t.Fatalf("%s: %+v, want both allowed with 3 remaining", base, d)
		}
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ws := tm.UnixMicro() - tm.UnixMicro()%time.Hour.Microseconds()
		keys, err := c.Keys(ctx, "*"+strings.TrimPrefix(base, "{rl}:")+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		wantS := strings.Replace(wrap, base, base+":s", 1) + ":v2s:" + strconv.FormatInt(ws, 10)
		wantT := strings.Replace(wrap, base, base+":t", 1) + ":v2g"
		if strings.HasPrefix(base, "{") {
			wantS, wantT = base+":s:v2s:"+strconv.FormatInt(ws, 10), base+":t:v2g"
		}
		slices.Sort(keys)
		if want := []string{wantS, wantT}; !slices.Equal(keys, want) {
			t.Fatalf("%s: keys %q, want %q", base, keys, want)
		}
		if redis.Slot(wantS) != redis.Slot(base+":s") || redis.Slot(wantT) != redis.Slot(base+":t") {
			t.Errorf("%s, %s: slots %d, %d; their bases' %d, %d", wantS, wantT, redis.Slot(wantS), redis.Slot(wantT), redis.Slot(base+":s"), redis.Slot(base+":t"))
		}
		if v, _ := c.Get(ctx, wantS).Result(); v != "2" {
			t.Errorf("%s holds %q, want 2", wantS, v)
		}
		ttl, _ := c.PTTL(ctx, wantS).Result()
		if ttl < d[0].ResetAfter || ttl > 2*time.Hour+2*time.Millisecond {
			t.Errorf("%s PTTL %v, want in [ResetAfter %v, 2 h]", wantS, ttl, d[0].ResetAfter)
		}
		v, _ := c.Get(ctx, wantT).Result()
		tat, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s holds %q, want an integer TAT", wantT, v)
		}
		// TAT = server now + 2 T, now within the time since the take
		if at := time.UnixMicro(tat).Add(-24 * time.Minute); at.After(tm) || tm.Sub(at) > time.Minute {
			t.Errorf("%s holds TAT %v, want 24 min after the take (server time now %v)", wantT, time.UnixMicro(tat), tm)
		}
		ttl, _ = c.PTTL(ctx, wantT).Result()
		if ttl < d[1].ResetAfter || ttl > 2*time.Hour+2*time.Millisecond {
			t.Errorf("%s PTTL %v, want in [ResetAfter %v, 2 h]", wantT, ttl, d[1].ResetAfter)
		}
		// A denial leaves the values as they were.
		d, err = algotest.Take(ctx, s, []algo.Hit{{Key: base + ":s", Limit: sw, Cost: 1}, {Key: base + ":t", Limit: tb, Cost: 4}})
		if err != nil {
			t.Fatal(err)
		}
		if d[1].Allowed || d[1].RetryAfter <= 0 || !d[0].Allowed || d[0].Remaining != 3 {
			t.Errorf("%s over: %+v, want the bucket denied with a RetryAfter, the window a check with 3 remaining", base, d)
		}
		if got, _ := c.Get(ctx, wantS).Result(); got != "2" {
			t.Errorf("%s holds %q after a denial, want 2", wantS, got)
		}
		if got, _ := c.Get(ctx, wantT).Result(); got != v {
			t.Errorf("%s holds %q after a denial, want %q", wantT, got, v)
		}
	}
	// A first hit that denies creates nothing.
	for _, l := range []algo.Limit{sw, tb} {
		if d, err := algotest.Take(ctx, s, []algo.Hit{{Key: "lk:big", Limit: l, Cost: 6}}); err != nil || d[0].Allowed {
			t.Fatalf("cost above the capacity: %+v %v, want denied", d, err)
		}
	}
	if keys, _ := c.Keys(ctx, "*lk:big*").Result(); len(keys) != 0 {
		t.Errorf("a denied first hit left %q", keys)
	}
}

// TestLeanSkew: Stores whose estimate of the server's clock is off by a
// window or more either way still count a sliding window in the server's
// windows (lean.lua refuses their keys, they send them again), so
// together they admit exactly the limit.
func TestLeanSkew(t *testing.T) {
	srv := redistest.Standalone(t)
	l := algo.Limit{Kind: algo.SlidingWindow, Rate: 30, Period: time.Hour}
	offsets := []time.Duration{0, -90 * time.Minute, 3 * time.Hour, 59 * time.Minute}
	var stores []*redis.Store
	for _, off := range offsets {
		s := windowStore(t, srv, nil)
		s.SetServerOffset(off.Microseconds())
		stores = append(stores, s)
	}
	if n := concurrentAllowed(t, stores, "lk:skew", l, 100); n != 30 {
		t.Fatalf("allowed %d of 100 across skewed Stores, want exactly 30", n)
	}
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	if keys, _ := c.Keys(context.Background(), "*lk:skew*").Result(); len(keys) != 1 {
		t.Errorf("keys %q, want the server's window only", keys)
	}
}

// TestLeanLayoutsApart: the lean keys never meet the default layout's
// (the one previous releases write): on one limit and key, a Store with
// window keys and one without each count on their own and neither reads
// the other's value.
func TestLeanLayoutsApart(t *testing.T) {
	srv := redistest.Standalone(t)
	lean := windowStore(t, srv, nil)
	old := newTestStore(t, srv, nil, 0)
	ctx := context.Background()
	for _, l := range []algo.Limit{
		{Kind: algo.SlidingWindow, Rate: 3, Period: time.Hour},
		{Kind: algo.TokenBucket, Rate: 3, Period: time.Hour},
	} {
		key := "apart:" + kindName(l)
		for i, s := range []*redis.Store{old, lean, old, lean} {
			d, err := algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 2}})
			if err != nil {
				t.Fatalf("%s take %d: %v", key, i, err)
			}
			// each layout: the first take of 2 of 3 allowed, the second denied
			if want := i < 2; d[0].Allowed != want {
				t.Errorf("%s take %d: %+v, want allowed %v", key, i, d[0], want)
			}
		}
	}
}
