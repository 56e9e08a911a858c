package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestStoreLocalCache: a denied single-hit key is answered locally until
// its RetryAfter (not the whole window), counted, and ResetCache clears it.
func TestStoreLocalCache(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	o := DefaultOptions()
	o.URL, o.Timeout, o.PoolSize, o.MinIdleConns, o.LocalCacheSize, o.Now = srv.URL(), time.Second, 2, 0, 16, clock
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	waitCacheLive(t, s)
	ctx := context.Background()
	// Token bucket 1 per second, capacity 2: the retry time is far shorter
	// than any window.
	h := []algo.Hit{{Key: "tb", Limit: algo.Limit{Kind: algo.TokenBucket, Rate: 1, Period: time.Second, Burst: 2}, Cost: 1}}
	take := func() algo.Decision {
		t.Helper()
		d, err := algotest.Take(ctx, s, h)
		if err != nil {
			t.Fatal(err)
		}
		return d[0]
	}
	take()
	take()
	d := take() // denied by Redis, cached until now+1s
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("third take %+v, want denied with RetryAfter 1s", d)
	}
	if s.CacheHits() != 0 {
		t.Fatal("cache hit before any cached denial")
	}
	if _, err := srv.Client().FlushAll(ctx).Result(); err != nil { // Redis would now allow
		t.Fatal(err)
	}
	now = now.Add(400 * time.Millisecond)
	d = take()
	if d.Allowed || d.RetryAfter != 600*time.Millisecond || s.CacheHits() != 1 {
		t.Fatalf("cached take %+v (hits %d), want a local denial with RetryAfter 600ms", d, s.CacheHits())
	}
	now = now.Add(600 * time.Millisecond) // RetryAfter reached: back to Redis
	if d = take(); !d.Allowed || s.CacheHits() != 1 {
		t.Fatalf("take at RetryAfter %+v (hits %d), want allowed by Redis", d, s.CacheHits())
	}
	// Deny again, then ResetCache (config reload): the next call goes to Redis.
	take()
	if d = take(); d.Allowed {
		t.Fatalf("expected a denial, got %+v", d)
	}
	s.ResetCache()
	if _, err := srv.Client().FlushAll(ctx).Result(); err != nil {
		t.Fatal(err)
	}
	if d = take(); !d.Allowed {
		t.Fatalf("after ResetCache %+v, want allowed by Redis", d)
	}
	// Concurrency denials are never cached (a release may free a lease).
	c := []algo.Hit{{Key: "cc", Limit: algo.Limit{Kind: algo.Concurrency, Rate: 1, Period: time.Minute}, Cost: 1}}
	for range 3 {
		if _, err := algotest.Take(ctx, s, c); err != nil {
			t.Fatal(err)
		}
	}
	if s.cache.Len() != 0 {
		t.Errorf("cache holds %d entries after concurrency denials, want 0", s.cache.Len())
	}
}

// TestStoreLocalCacheLookupCounts replays envoyproxy/ratelimit's
// integration sequence (always_charge fixed windows, as reference mode
// counts): every cacheable hit is one lookup, a hit when it answers a
// denial (FromCache), a miss otherwise, as its freecache counts them; a
// cached hit of a request whose other hits are Kept is answered locally
// while those go to Redis.
func TestStoreLocalCacheLookupCounts(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC) // far from a minute or hour boundary
	o := DefaultOptions()
	o.URL, o.Timeout, o.PoolSize, o.MinIdleConns, o.LocalCacheSize = srv.URL(), 5*time.Second, 2, 0, 16
	o.Now = func() time.Time { return now }
	o.CacheUncharged = true // envoyproxy/ratelimit's counting, which these counts mirror
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	waitCacheLive(t, s)
	if !s.CacheEnabled() {
		t.Fatal("cache disabled")
	}
	ctx := context.Background()
	fixed := func(key string, rate int64, period time.Duration) algo.Hit {
		return algo.Hit{Key: key, Limit: algo.Limit{Kind: algo.FixedWindow, Rate: rate, Period: period}, Cost: 1, Charge: true}
	}
	take := func(hits ...algo.Hit) []algo.Decision {
		t.Helper()
		d, err := algotest.Take(ctx, s, hits)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	counts := func(step string, hits, misses uint64) {
		t.Helper()
		if s.CacheHits() != hits || s.CacheMisses() != misses {
			t.Fatalf("%s: cache hits/misses %d/%d, want %d/%d", step, s.CacheHits(), s.CacheMisses(), hits, misses)
		}
	}
	take(fixed("key1", 50, time.Second))
	counts("key1", 0, 1)

	key2 := fixed("key2", 20, time.Minute)
	for i := range 25 {
		d := take(key2)[0]
		if d.Allowed != (i < 20) || d.FromCache != (i > 20) {
			t.Fatalf("key2 #%d: %+v", i, d)
		}
		if i < 20 {
			counts("key2 within", 0, uint64(i+2))
		} else {
			counts("key2 over", uint64(i-20), 22)
		}
	}

	key2b, key3 := fixed("key2b", 20, time.Minute), fixed("key3", 10, time.Hour)
	for i := range 15 {
		d := take(key2b, key3)
		if !d[0].Allowed || d[0].FromCache || d[0].Remaining != int64(20-(i+1)) {
			t.Fatalf("key2b #%d: %+v, want allowed by Redis with %d remaining", i, d[0], 20-(i+1))
		}
		if d[1].Allowed != (i < 10) || d[1].FromCache != (i > 10) {
			t.Fatalf("key3 #%d: %+v", i, d[1])
		}
		if i < 10 {
			counts("both miss", 4, uint64(i*2+24))
		} else {
			counts("key3 hit", uint64(i-6), uint64(i+34))
		}
	}

	// all_or_nothing: a cached denial next to a hit that is not Kept does
	// not answer the request; Redis decides all of it, and its denial of
	// the cached hit is reported as the cache's.
	plain := algo.Hit{Key: "plain", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}, Cost: 1}
	h0, m0 := s.CacheHits(), s.CacheMisses()
	d := take(plain, key3)
	if !d[0].Allowed || d[0].Remaining != 5 || d[0].FromCache || d[1].Allowed || !d[1].FromCache {
		t.Fatalf("mixed all_or_nothing: %+v, want key3 denied (cached, confirmed by Redis), plain not consumed", d)
	}
	counts("mixed", h0+1, m0+1)

	// Concurrency and refund hits are never looked up.
	take(algo.Hit{Key: "cc", Limit: algo.Limit{Kind: algo.Concurrency, Rate: 1, Period: time.Minute}, Cost: 1})
	counts("concurrency", h0+1, m0+1)
}
