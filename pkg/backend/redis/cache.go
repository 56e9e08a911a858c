package redis

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"
)

// overLimitCache is the optional local over-limit cache: a bounded LRU of
// keys known to be denied, each with the instant until which a hit of the
// same cost (or more) is certainly denied again. Entries are answered
// locally until that instant (the decision's RetryAfter, not the whole
// window), so a denied client hammering a key costs no Redis round trip.
//
// An entry is only ever created from a denial of a hit whose key occurs
// once in its request: the key's state can only become more permissive
// with time, and other replicas can only consume more, so the cached
// answer can never be more permissive than Redis' would be. The exception
// is a refund (algo.Hit.Release), which credits the key: the Store drops
// the key's entry before it sends a refund, and a refund through another
// replica is seen here once the entry's instant has passed. always_charge
// hits are never answered from the cache (they must be charged). Safe for
// concurrent use.
type overLimitCache struct {
	mu     sync.Mutex
	max    int
	ll     *list.List // front = most recently used
	items  map[string]*list.Element
	hits   atomic.Uint64 // lookups that answered a denial
	misses atomic.Uint64 // lookups that did not
}

type cacheEntry struct {
	key   string
	until time.Time // denial holds strictly before until
	cost  int64     // smallest cost known to be denied
	dec   cacheDecision
}

// cacheDecision is the decision that produced the entry; RetryAfter,
// ResetAfter and WindowAfter are recomputed from their deadlines.
type cacheDecision struct {
	remaining int64
	reset     time.Time
	window    time.Time
}

func newOverLimitCache(size int) *overLimitCache {
	if size <= 0 {
		return nil
	}
	return &overLimitCache{max: size, ll: list.New(), items: make(map[string]*list.Element, size)}
}

// lookup reports a cached denial for key at now for the given cost; it
// counts one hit or one miss.
func (c *overLimitCache) lookup(key string, cost int64, now time.Time) (cacheEntry, bool) {
	if c == nil {
		return cacheEntry{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		c.misses.Add(1)
		return cacheEntry{}, false
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.until) {
		c.ll.Remove(el)
		delete(c.items, key)
		c.misses.Add(1)
		return cacheEntry{}, false
	}
	if cost < e.cost {
		c.misses.Add(1)
		return cacheEntry{}, false
	}
	c.ll.MoveToFront(el)
	c.hits.Add(1)
	return *e, true
}

// add records that key denies cost (and more) until until.
func (c *overLimitCache) add(e cacheEntry) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[e.key]; ok {
		*el.Value.(*cacheEntry) = e
		c.ll.MoveToFront(el)
		return
	}
	for c.ll.Len() >= c.max {
		last := c.ll.Back()
		c.ll.Remove(last)
		delete(c.items, last.Value.(*cacheEntry).key)
	}
	c.items[e.key] = c.ll.PushFront(&e)
}

// drop removes key's entry, if any (its key was credited by a release).
func (c *overLimitCache) drop(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.ll.Remove(el)
		delete(c.items, key)
	}
}

// reset drops every entry.
func (c *overLimitCache) reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ll.Init()
	clear(c.items)
}

func (c *overLimitCache) len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}

// remove drops key's entry, if any.
func (c *overLimitCache) remove(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.ll.Remove(el)
		delete(c.items, key)
	}
}
