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

// Cache is the optional local over-limit cache: a bounded LRU of
// keys known to be denied, each with the instant until which a hit of the
// same cost (or more) is certainly denied again. Entries are answered
// locally until that instant (the decision's RetryAfter, not the whole
// window), so a denied client hammering a key costs no backend round trip.
//
// An entry is only ever created from a denial of a hit whose key occurs
// once in its request: the key's state can only become more permissive
// with time, and other replicas can only consume more, so the cached
// answer can never be more permissive than the backend's would be. The exception
// is a credit (a refund, algo.Hit.Release, or a reset): Take drops the
// key's entry before it sends a refund, and a store that learns of other
// replicas' credits calls Invalidate (the Redis store does, from a
// channel every replica's refunds and resets are published on). An entry
// holds for its limit only (a request override or a reloaded limit on the
// same key misses). Every credit, Reset and Suspend advances a generation:
// a denial whose backend call started before the latest one is not
// remembered, so a credit received while the call was in flight is never
// undone by it. While suspended (Suspend, until Resume) the cache answers
// nothing and remembers nothing. always_charge
// hits are never answered from the cache (they must be charged), except
// on a fixed window (see Cacheable). A nil *Cache is a disabled cache:
// every method is a no-op. Safe for concurrent use.
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
// evicted first); size <= 0 returns nil (disabled). Memory grows with the
// entries held, not with size: nothing proportional to size is allocated
// up front, so a large bound costs nothing until denials fill it (about
// 200 bytes per entry plus its key's length, see docs/redis.md).
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
// (len(out) == len(hits)): a release first drops its key's entry; every
// Cacheable hit is looked up once, in request order (one counted hit or
// miss each, as envoyproxy/ratelimit looks up every descriptor); then
//   - when every hit is a cached denial, the request is answered locally
//     (each decision FromCache) and take is not called;
//   - when some are and all the others are Kept (releases, always_charge),
//     only the others go to take: their effect does not depend on the
//     cached denials;
//   - otherwise take decides the whole request (a hit that is not Kept
//     consumes only when the whole request passes, which the backend alone
//     decides); a cached denial the backend confirms is reported FromCache.
//
// The denials take returns are remembered (see remember). now is the
// clock (read once before the lookups and once after take). On a nil
// Cache, Take is take. Errors are take's, unchanged, except that a
// *causes.Partial of the hits sent to take is given for the whole request
// (its decisions and failed indexes placed at the request's positions).
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
