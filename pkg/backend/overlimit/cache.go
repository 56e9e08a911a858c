// Package overlimit is the local over-limit cache the Redis and memcached
// stores share (envoyproxy/ratelimit's LOCAL_CACHE_SIZE_IN_BYTES, here
// --local-cache-size entries): denials of keys are remembered and answered
// locally until their RetryAfter, without a backend round trip.
package overlimit

import (
	"container/list"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
)

// Cache is a bounded LRU of keys known to be denied, each until the
// denial's RetryAfter for its limit and a cost at least as large. Until
// then only a credit could make the backend answer differently, so Take
// answers those hits locally, and credits (Remove, Invalidate) drop the
// entry. A denial whose backend call overlapped a credit, Reset or Suspend
// is not remembered. A nil *Cache is a disabled cache: every method is a
// no-op. It is safe for concurrent use.
type Cache struct {
	mu     sync.Mutex
	max    int
	ll     *list.List // front = most recently used
	items  map[string]*list.Element
	hits   atomic.Uint64 // lookups that answered a denial
	misses atomic.Uint64 // lookups that did not
	// gen advances on every credit (Remove, Invalidate), Reset and
	// Suspend: see remember.
	gen uint64
	// suspended: lookups miss, denials are not remembered (Suspend,
	// Resume).
	suspended bool
	// unchargedOff: always_charge hits are never answered (see
	// WithoutUncharged).
	unchargedOff bool
}

type cacheEntry struct {
	key   string
	limit algo.Limit // the limit the denial was decided against
	until time.Time  // denial holds strictly before until
	cost  int64      // smallest cost known to be denied
	dec   cacheDecision
}

// cacheDecision is the decision that produced the entry; RetryAfter,
// ResetAfter and WindowAfter are recomputed from their deadlines.
type cacheDecision struct {
	remaining int64
	reset     time.Time
	window    time.Time
}

// New returns a cache of at most size entries (least recently used
// evicted first); size <= 0 returns nil (disabled). Nothing proportional
// to size is allocated up front: memory grows with the entries held.
func New(size int) *Cache {
	if size <= 0 {
		return nil
	}
	return &Cache{max: size, ll: list.New(), items: map[string]*list.Element{}}
}

// lookup reports a cached denial for key under limit at now for the
// given cost; it counts one hit or one miss (a miss while suspended).
func (c *Cache) lookup(key string, limit algo.Limit, cost int64, now time.Time) (cacheEntry, bool) {
	if c == nil {
		return cacheEntry{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.suspended {
		c.misses.Add(1)
		return cacheEntry{}, false
	}
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
	if cost < e.cost || e.limit != limit {
		c.misses.Add(1)
		return cacheEntry{}, false
	}
	c.ll.MoveToFront(el)
	c.hits.Add(1)
	return *e, true
}

// add records that e.key denies e.cost (and more) until e.until.
func (c *Cache) add(e cacheEntry) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addLocked(e)
}

// addLocked is add; the caller holds mu.
func (c *Cache) addLocked(e cacheEntry) {
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

// WithoutUncharged makes c answer no always_charge hit, not even on a
// fixed window (see Cacheable), and returns c: every such hit is
// charged, so a later refund credits a count that includes every denied
// hit. envoyproxy/ratelimit's cache (and so reference mode) skips those
// charges; ratelimitd's own counting does not.
func (c *Cache) WithoutUncharged() *Cache {
	if c != nil {
		c.unchargedOff = true
	}
	return c
}

// cacheable is Cacheable, and no always_charge hit when unchargedOff.
func (c *Cache) cacheable(h algo.Hit) bool {
	return Cacheable(h) && (!c.unchargedOff || !h.Charge)
}

// Reset drops every entry. Call it on a config reload so that no denial
// computed under an old limit survives.
func (c *Cache) Reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flush()
}

// flush drops every entry and advances the generation; the caller holds
// mu.
func (c *Cache) flush() {
	c.ll.Init()
	clear(c.items)
	c.gen++
}

// Suspend drops every entry and stops the cache until Resume: lookups
// miss and denials are not remembered. A store calls it when it can no
// longer learn of other replicas' credits (see Invalidate).
func (c *Cache) Suspend() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flush()
	c.suspended = true
}

// Resume starts a suspended cache again, empty.
func (c *Cache) Resume() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flush()
	c.suspended = false
}

// Suspended reports whether the cache is suspended (false when disabled).
func (c *Cache) Suspended() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.suspended
}

// Invalidate drops key's entry because the key was credited elsewhere (a
// refund or reset through another replica): the same as Remove.
func (c *Cache) Invalidate(key string) { c.Remove(key) }

// generation is the current generation (see remember).
func (c *Cache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// Len is the number of entries (0 when disabled).
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}

// Remove drops key's entry, if any (its counter was credited or reset),
// and advances the generation.
func (c *Cache) Remove(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if el, ok := c.items[key]; ok {
		c.ll.Remove(el)
		delete(c.items, key)
	}
}

// Hits is the number of lookups that found a denial since the cache was
// created (envoyproxy/ratelimit's ratelimit.localcache.hitCount; 0 when
// disabled).
func (c *Cache) Hits() uint64 {
	if c == nil {
		return 0
	}
	return c.hits.Load()
}

// Misses is the number of lookups that found no denial
// (envoyproxy/ratelimit's ratelimit.localcache.missCount; 0 when
// disabled).
func (c *Cache) Misses() uint64 {
	if c == nil {
		return 0
	}
	return c.misses.Load()
}

// Cacheable reports whether a denial of h may be answered locally until
// its RetryAfter: concurrency leases can be released early, so they never
// are; a release is never denied; an always_charge hit must reach the
// backend to be charged, except on a fixed window, whose denial holds
// until the window ends however much more is charged (envoyproxy/ratelimit
// does not increment a key its local cache holds either). A hit with a
// penalty box never is: the backend counts its denials toward a block.
func Cacheable(h algo.Hit) bool {
	if h.Limit.Kind == algo.Concurrency || h.Release || h.Penalty.On() {
		return false
	}
	return !h.Charge || h.Limit.Kind == algo.FixedWindow
}

// TakeFunc decides hits on the backend (a store's Take without the cache)
// into out: one decision per hit, in order (len(out) == len(hits)).
type TakeFunc func(ctx context.Context, hits []algo.Hit, out []algo.Decision) error

// Take decides the hits of one request through the cache into out
// (len(out) == len(hits)). Releases drop their keys' entries and every
// Cacheable hit is looked up once. When every hit is a cached denial, take
// is not called; when the others are all Kept, only they go to take;
// otherwise take decides the whole request, since a hit that is not Kept
// consumes only when the whole request passes. The denials take returns are
// remembered. A *causes.Partial from take is remapped to the request's
// positions; other errors are returned unchanged. On a nil Cache, Take is
// take.
func (c *Cache) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision, now func() time.Time, take TakeFunc) error {
	if c == nil || len(hits) == 0 {
		return take(ctx, hits, out)
	}
	for _, h := range hits {
		if h.Release {
			c.Remove(h.Key) // credited by a release
		}
	}
	gen := c.generation()
	rest, cached := c.fromCache(hits, out, now())
	if len(rest) == 0 {
		return nil
	}
	if len(rest) < len(hits) {
		sub := make([]algo.Hit, len(rest))
		for j, i := range rest {
			sub[j] = hits[i]
		}
		subOut := make([]algo.Decision, len(rest))
		if err := c.takeAndRemember(ctx, sub, subOut, now, gen, take); err != nil {
			return remapPartial(err, rest, out)
		}
		for j, i := range rest {
			out[i] = subOut[j]
		}
		return nil
	}
	if err := c.takeAndRemember(ctx, hits, out, now, gen, take); err != nil {
		return err
	}
	for _, i := range cached {
		out[i].FromCache = !out[i].Allowed
	}
	return nil
}

func (c *Cache) takeAndRemember(ctx context.Context, hits []algo.Hit, out []algo.Decision, now func() time.Time, gen uint64, take TakeFunc) error {
	if err := take(ctx, hits, out); err != nil {
		return err
	}
	c.remember(hits, out, now(), gen)
	return nil
}

// fromCache looks every cacheable hit up and answers from the cache the
// hits it can; it returns the indexes of the hits the backend must
// decide, in order (see Take), and, when that is all of them although
// some lookups found a denial, those hits' indexes (cached), their
// cached decisions being discarded.
func (c *Cache) fromCache(hits []algo.Hit, out []algo.Decision, now time.Time) (rest, cached []int) {
	rest = make([]int, 0, len(hits))
	restKept := true
	for i, h := range hits {
		if c.cacheable(h) {
			if e, ok := c.lookup(h.Key, h.Limit, h.Cost, now); ok {
				cached = append(cached, i)
				out[i] = algo.Decision{
					Allowed:     false,
					Remaining:   e.dec.remaining,
					RetryAfter:  e.until.Sub(now),
					ResetAfter:  max(0, e.dec.reset.Sub(now)),
					WindowAfter: max(0, e.dec.window.Sub(now)),
					FromCache:   true,
				}
				continue
			}
		}
		rest = append(rest, i)
		restKept = restKept && h.Kept()
	}
	if len(rest) == 0 || restKept {
		return rest, nil
	}
	all := rest[:0]
	for i := range hits {
		out[i] = algo.Decision{}
		all = append(all, i)
	}
	return all, cached
}

// remember caches the denials of hits whose key occurs once in the request
// (a repeated key's denial depends on the request's earlier hits), unless
// the generation moved from gen (read before the backend call): a credit
// received meanwhile may postdate the backend's answer, which then must
// not outlive it; nor while suspended.
func (c *Cache) remember(hits []algo.Hit, out []algo.Decision, now time.Time, gen uint64) {
	if !slices.ContainsFunc(out, func(d algo.Decision) bool { return !d.Allowed }) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.suspended || c.gen != gen {
		return
	}
	for i, h := range hits {
		d := out[i]
		if d.Allowed || d.RetryAfter <= 0 || !c.cacheable(h) {
			continue
		}
		dup := false
		for j := range hits {
			if j != i && hits[j].Key == h.Key {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		c.addLocked(cacheEntry{
			key:   h.Key,
			limit: h.Limit,
			until: now.Add(d.RetryAfter),
			cost:  h.Cost,
			dec: cacheDecision{
				remaining: d.Remaining,
				reset:     now.Add(d.ResetAfter),
				window:    now.Add(d.WindowAfter),
			},
		})
	}
}

// remapPartial is err, or, when err is a *causes.Partial of the hits at
// the positions rest of a request whose other decisions are in out, the
// same Partial for the whole request.
func remapPartial(err error, rest []int, out []algo.Decision) error {
	var p *causes.Partial
	if !errors.As(err, &p) || len(p.Decisions) != len(rest) {
		return err
	}
	whole := &causes.Partial{Decisions: out, Failed: make([]int, len(p.Failed)), Err: p.Err}
	for j, i := range rest {
		out[i] = p.Decisions[j]
	}
	for k, j := range p.Failed {
		whole.Failed[k] = rest[j]
	}
	return whole
}
