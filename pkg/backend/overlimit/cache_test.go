package overlimit

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

func TestOverLimitCacheLRU(t *testing.T) {
	base := time.Unix(1000, 0)
	c := New(2)
	c.add(cacheEntry{key: "a", until: base.Add(time.Second), cost: 1})
	c.add(cacheEntry{key: "b", until: base.Add(time.Second), cost: 1})
	if _, ok := c.lookup("a", algo.Limit{}, 1, base); !ok { // a is now most recent
		t.Fatal("a missing")
	}
	c.add(cacheEntry{key: "c", until: base.Add(time.Second), cost: 1}) // evicts b
	if c.Len() != 2 {
		t.Fatalf("len %d, want 2 (bounded)", c.Len())
	}
	if _, ok := c.lookup("b", algo.Limit{}, 1, base); ok {
		t.Error("b should have been evicted (least recently used)")
	}
	steps := []struct {
		key  string
		cost int64
		at   time.Duration
		hit  bool
	}{
		{"a", 1, 0, true},
		{"a", 5, 0, true},  // a larger cost is denied too
		{"a", 0, 0, false}, // a check may pass where cost 1 did not
		{"c", 1, time.Second - time.Microsecond, true},  // until RetryAfter...
		{"c", 1, time.Second, false},                    // ...not after
		{"c", 1, time.Second - time.Microsecond, false}, // expired entries are dropped
		{"zz", 1, 0, false},
	}
	for i, s := range steps {
		if _, ok := c.lookup(s.key, algo.Limit{}, s.cost, base.Add(s.at)); ok != s.hit {
			t.Errorf("step %d %+v: hit=%v", i, s, ok)
		}
	}
	if got := c.Hits(); got != 4 {
		t.Errorf("hits counter %d, want 4", got)
	}
	if got := c.Misses(); got != 5 {
		t.Errorf("misses counter %d, want 5", got)
	}
	c.Reset()
	if c.Len() != 0 {
		t.Error("reset left entries")
	}
	var nilCache *Cache // size 0 disables the cache
	if New(0) != nil {
		t.Error("size 0 should disable the cache")
	}
	nilCache.add(cacheEntry{key: "x", until: base.Add(time.Hour)})
	if _, ok := nilCache.lookup("x", algo.Limit{}, 1, base); ok {
		t.Error("disabled cache answered")
	}
}

// TestOverLimitCacheCreditDuringTake: a credit (Invalidate, Remove), a
// Reset or a Suspend that arrives while the backend call is in flight
// keeps that call's denial out of the cache (it may predate the credit),
// and a denial is cached for its limit only.
func TestOverLimitCacheCreditDuringTake(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	hits := []algo.Hit{{Key: "k", Limit: l, Cost: 1}}
	denied := []algo.Decision{{RetryAfter: time.Minute, ResetAfter: time.Minute, WindowAfter: time.Minute}}
	for name, during := range map[string]func(c *Cache){
		"invalidate": func(c *Cache) { c.Invalidate("k") },
		"other key":  func(c *Cache) { c.Invalidate("other") },
		"reset":      func(c *Cache) { c.Reset() },
		"suspend":    func(c *Cache) { c.Suspend(); c.Resume() },
	} {
		c := New(8)
		calls := 0
		take := func(_ context.Context, _ []algo.Hit, out []algo.Decision) error {
			calls++
			if calls == 1 {
				during(c)
			}
			copy(out, denied)
			return nil
		}
		for range 3 {
			if err := c.Take(context.Background(), hits, make([]algo.Decision, len(hits)), clock, take); err != nil {
				t.Fatal(err)
			}
		}
		if calls != 2 {
			t.Errorf("%s during the first call: %d backend calls for 3 takes, want 2 (the second one's denial cached)", name, calls)
		}
	}
	c := New(8)
	calls := 0
	take := func(_ context.Context, _ []algo.Hit, out []algo.Decision) error {
		calls++
		copy(out, denied)
		return nil
	}
	other := []algo.Hit{{Key: "k", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Hour}, Cost: 1}}
	for _, h := range [][]algo.Hit{hits, hits, other} {
		if err := c.Take(context.Background(), h, make([]algo.Decision, len(h)), clock, take); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 2 {
		t.Errorf("%d backend calls, want 2: the second limit on the key is not answered by the first's denial", calls)
	}
	c.Suspend()
	if err := c.Take(context.Background(), other, make([]algo.Decision, len(other)), clock, take); err != nil || calls != 3 || c.Len() != 0 {
		t.Errorf("suspended: calls %d, entries %d (err %v), want 3 calls and nothing cached", calls, c.Len(), err)
	}
}
