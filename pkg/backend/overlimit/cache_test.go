package overlimit

import (
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
