package memcache_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
)

// TestLocalCache: with Options.LocalCacheSize, a fixed-window denial from
// memcached is answered locally (FromCache) until the window ends, one
// counted lookup per hit of a request in order, with the same rules for
// requests that mix cached and uncached hits as the Redis store; a cached
// answer needs no memcached at all.
func TestLocalCache(t *testing.T) {
	srv := memcachetest.Start(t)
	clock := newPinned(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	o := memcache.DefaultOptions()
	o.Addrs = []string{srv.Addr()}
	o.Timeout = testTimeout
	o.Now = clock.Now
	o.HealthInterval = 0
	o.LocalCacheSize = 16
	s := openStore(t, o)
	if !s.CacheEnabled() {
		t.Fatal("CacheEnabled false with LocalCacheSize 16")
	}
	counts := func(step string, hits, misses uint64) {
		t.Helper()
		if h, m := s.CacheHits(), s.CacheMisses(); h != hits || m != misses {
			t.Fatalf("%s: cache hits/misses %d/%d, want %d/%d", step, h, m, hits, misses)
		}
	}
	p := uniq(t)
	k := algo.Hit{Key: p + ".k", Limit: fixed(2, time.Minute), Cost: 1}
	other := algo.Hit{Key: p + ".other", Limit: fixed(5, time.Minute), Cost: 1}

	for i := range 2 {
		if d := take(t, s, k); !d[0].Allowed || d[0].FromCache {
			t.Fatalf("k #%d: %+v, want allowed by memcached", i, d[0])
		}
		counts("k allowed", 0, uint64(i+1))
	}
	d := take(t, s, k)
	if d[0].Allowed || d[0].FromCache || d[0].RetryAfter != time.Minute {
		t.Fatalf("k #2: %+v, want denied by memcached, retry after 1m", d[0])
	}
	counts("k denied", 0, 3)

	clock.Advance(10 * time.Second)
	d = take(t, s, k)
	if d[0].Allowed || !d[0].FromCache || d[0].Remaining != 0 || d[0].RetryAfter != 50*time.Second || d[0].ResetAfter != 50*time.Second {
		t.Fatalf("k cached: %+v, want denied from the cache, retry and reset after 50s", d[0])
	}
	counts("k cached", 1, 3)

	// A cached denial next to a hit that is not Kept does not answer the
	// request: memcached decides all of it (other is refunded: the
	// request is denied) and its denial of k is reported as the cache's.
	d = take(t, s, other, k)
	if !d[0].Allowed || d[0].Remaining != 5 || d[0].FromCache || d[1].Allowed || !d[1].FromCache {
		t.Fatalf("mixed: %+v, want k denied (cached, confirmed by memcached), other not consumed", d)
	}
	counts("mixed", 2, 4)
	if d := take(t, s, algo.Hit{Key: other.Key, Limit: other.Limit}); !d[0].Allowed || d[0].Remaining != 5 {
		t.Fatalf("other after the denied request: %+v, want 5 remaining (nothing consumed)", d[0])
	}
	counts("check other", 2, 5)
	// A check (cost 0) of k may pass where cost 1 did not: a miss, which
	// memcached denies (k is exhausted).
	if d := take(t, s, algo.Hit{Key: k.Key, Limit: k.Limit}); d[0].Allowed || d[0].FromCache || d[0].Remaining != 0 {
		t.Fatalf("check k: %+v, want denied by memcached with 0 remaining", d[0])
	}
	counts("check k", 2, 6)
	// A cached denial next to an always_charge hit: only that one goes to
	// memcached (it takes effect whatever the denial).
	charged := algo.Hit{Key: p + ".charged", Limit: fixed(5, time.Minute), Cost: 1, Charge: true}
	d = take(t, s, k, charged)
	if d[0].Allowed || !d[0].FromCache || !d[1].Allowed || d[1].Remaining != 4 {
		t.Fatalf("k with always_charge: %+v, want k from the cache, charged allowed with 4 remaining", d)
	}
	counts("k with always_charge", 3, 7)
	// A key repeated in a request is looked up per hit, but its denial is
	// not cached (it depends on the request's earlier hits).
	dup := algo.Hit{Key: p + ".dup", Limit: fixed(1, time.Minute), Cost: 1}
	if d := take(t, s, dup, dup); d[1].Allowed {
		t.Fatalf("dup: %+v, want the second hit denied", d)
	}
	counts("dup", 3, 9)
	if d := take(t, s, dup); !d[0].Allowed || d[0].FromCache {
		t.Fatalf("dup alone: %+v, want allowed by memcached (the denied request was refunded)", d[0])
	}
	counts("dup alone", 3, 10)
	if d := take(t, s, dup); d[0].Allowed || d[0].FromCache {
		t.Fatalf("dup alone again: %+v, want denied by memcached", d[0])
	}
	counts("dup alone again", 3, 11)

	// Reset drops the entry: memcached decides k again, from a full quota.
	if err := s.Reset(context.Background(), []algo.Hit{k}); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if d := take(t, s, k); !d[0].Allowed || d[0].FromCache || d[0].Remaining != 1 {
		t.Fatalf("k after Reset: %+v, want allowed by memcached with 1 remaining", d[0])
	}
	counts("k after Reset", 3, 12)
	for range 2 {
		take(t, s, k) // allowed, then denied and cached
	}
	counts("k denied again", 3, 14)

	// Cached answers need no memcached.
	srv.Kill()
	for i := range 3 {
		if d := take(t, s, k, dup); d[0].Allowed || !d[0].FromCache || d[1].Allowed || !d[1].FromCache {
			t.Fatalf("cached with memcached down #%d: %+v, want both from the cache", i, d)
		}
	}
	counts("memcached down", 9, 14)
	if _, err := algotest.Take(context.Background(), s, []algo.Hit{other}); err == nil {
		t.Fatal("uncached hit with memcached down: no error")
	}
	counts("uncached with memcached down", 9, 15)

	// The entry holds until the window ends, not after.
	clock.Advance(50*time.Second - time.Microsecond)
	if d := take(t, s, k); !d[0].FromCache {
		t.Fatalf("k just before the window ends: %+v, want from the cache", d[0])
	}
	counts("k before window end", 10, 15)
	clock.Advance(time.Microsecond)
	if _, err := algotest.Take(context.Background(), s, []algo.Hit{k}); err == nil {
		t.Fatal("k in the next window with memcached down: no error (answered from an expired entry)")
	}
	counts("k after window end", 10, 16)

	// ResetCache drops every entry.
	s.ResetCache()
	if _, err := algotest.Take(context.Background(), s, []algo.Hit{dup}); err == nil {
		t.Fatal("dup after ResetCache with memcached down: no error")
	}
	counts("after ResetCache", 10, 17)
}

// TestLocalCacheDisabled: without LocalCacheSize nothing is cached or
// counted.
func TestLocalCacheDisabled(t *testing.T) {
	srv := memcachetest.Start(t)
	s := newStore(t, []string{srv.Addr()}, nil)
	if s.CacheEnabled() {
		t.Fatal("CacheEnabled true by default")
	}
	k := algo.Hit{Key: uniq(t), Limit: fixed(1, time.Hour), Cost: 1}
	for range 3 {
		if d := take(t, s, k); d[0].FromCache {
			t.Fatalf("FromCache with the cache disabled: %+v", d[0])
		}
	}
	if h, m := s.CacheHits(), s.CacheMisses(); h != 0 || m != 0 {
		t.Fatalf("cache hits/misses %d/%d with the cache disabled, want 0/0", h, m)
	}
}
