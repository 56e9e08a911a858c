package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// leaseTable holds the subscribers' demand of leased keys. The leased
// counters themselves are the shard entries Take decides, so a lease and
// the hits decided exactly on one key count together. Demand is reported
// a few times per interval per key, not per request, so one lock
// suffices.
type leaseTable struct {
	mu   sync.Mutex
	keys map[string]*leased
	// sweepAt is the table size from which the next Lease drops the keys
	// whose demands are all stale.
	sweepAt int
}

// leased is one key's subscribers' last demands.
type leased struct {
	stale  int64 // LeaseRequest.Stale of the last Lease
	demand map[int64]reported
}

// reported is a demand and when (µs) it was reported.
type reported struct{ units, at int64 }

// errNotLeasable is the error of a Lease of a limit algo.Leasable refuses.
var errNotLeasable = errors.New("memory: limit cannot be leased")

// Lease does req in one hold of the key's shard lock: it gives back
// req.Return units when they were granted in the current window (any time
// for a token bucket), charges up to req.Want units on the state Take
// decides for req.Key, records the subscriber's demand and lists the
// others' that are not older than req.Stale. On a full store a new key is
// leased from its sketch, as Take would decide it. algo.Lease gets bornUs
// 0: the leases and the store live in one process, so no lease predates
// the store. It fails only on a limit that is not leasable or when ctx is
// done.
func (s *Store) Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	if err := ctx.Err(); err != nil {
		return algo.LeaseGrant{}, fmt.Errorf("memory: %w", err)
	}
	if !algo.Leasable(req.Limit) {
		return algo.LeaseGrant{}, fmt.Errorf("%w: kind %d", errNotLeasable, req.Limit.Kind)
	}
	now := s.now()
	t := now.UnixMicro()
	x := maphash.String(s.seed, req.Key)
	var refs [1]ref
	var locks [1]int
	refs[0] = ref{h32: uint32(x), shard: int((x >> 32) % uint64(len(s.shards)))}
	locks[0] = refs[0].shard
	c := call{refs: refs[:], locks: locks[:]}

	g, short := s.lease(&c, req, now, false)
	if short > 0 {
		if got := s.makeRoom(&c, short, t); got > 0 {
			c.held += got
			if got >= short {
				g, short = s.lease(&c, req, now, false)
			}
		}
		if short > 0 {
			g, _ = s.lease(&c, req, now, true)
		}
	}
	if c.held > 0 {
		s.keys.Add(-c.held)
	}
	if c.evicted > 0 {
		s.evicted.Add(c.evicted)
	}
	if c.scanned > 0 {
		s.scanned.Add(c.scanned)
	}
	g.Now = t
	g.Demands = s.leases.report(req, t)
	return g, nil
}

// lease does the counter part of req with its shard locked, as take does
// for one hit: it returns the grant, and 0 when it is committed or the
// number of slots it still needs for a new key, having written nothing.
// With over (the store is full), an absent key is charged on its window's
// sketch and takes no slot.
func (s *Store) lease(c *call, req algo.LeaseRequest, now time.Time, over bool) (algo.LeaseGrant, int64) {
	t := now.UnixMicro()
	l := req.Limit
	r := &c.refs[0]
	sh := &s.shards[r.shard]
	sh.mu.Lock()
	defer sh.mu.Unlock()

	r.id, r.ok = sh.find(req.Key, r.h32)
	if r.ok && sh.exp(r.id) <= t {
		// expired: it reads as absent, and its slot passes to this call
		sh.remove(r.id)
		r.ok = false
		c.held++
	}
	var prev algo.State
	switch {
	case r.ok:
		prev = sh.state(r.id)
	case over && s.sk.make(l) == nil:
		// no slot and no sketch: nothing can be counted, so nothing is granted
		s.sk.refused.Add(1)
		_, d := algo.Take(l, s.sk.estimate(l, req.Key, t), now, 0)
		return algo.LeaseGrant{Remaining: d.Remaining}, 0
	case s.sk.m.Load() != nil:
		prev = s.sk.estimate(l, req.Key, t)
	}
	st := prev
	if req.Return > 0 && returnable(l, req.ReturnWindow, t) {
		st, _ = algo.Release(l, st, now, req.Return)
	}
	var g algo.LeaseGrant
	var d algo.Decision
	st, g.Granted, d = algo.Lease(l, st, now, req.Want, 0)
	g.Remaining = d.Remaining
	// a lease is not a hit of the key's penalty box: it leaves the box as
	// it is
	st = algo.KeepPenalty(st, prev)

	exp := algo.ExpiresAtUs(l, st)
	switch {
	case over && !r.ok:
		s.sk.approx.Add(1)
		s.sk.merge(l, req.Key, st)
	case exp <= t:
		if r.ok {
			sh.remove(r.id)
			c.held++
		}
	case r.ok:
		sh.update(r.id, st, exp)
	default:
		if short := s.room(c, 1, t); short > 0 {
			return algo.LeaseGrant{}, short
		}
		sh.insert(req.Key, r.h32, st, exp)
	}
	return g, 0
}

// report records req's subscriber's demand on req.Key at t, drops the
// demands older than req.Stale and returns the others in ascending
// Subscriber order.
func (lt *leaseTable) report(req algo.LeaseRequest, t int64) []algo.SubscriberDemand {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.keys == nil {
		lt.keys = map[string]*leased{}
		lt.sweepAt = 1024
	}
	if len(lt.keys) >= lt.sweepAt {
		lt.sweep(t)
	}
	e := lt.keys[req.Key]
	if e == nil {
		e = &leased{demand: map[int64]reported{}}
		lt.keys[req.Key] = e
	}
	e.stale = req.Stale
	e.demand[req.Subscriber] = reported{units: max(req.Demand, 0), at: t}
	var out []algo.SubscriberDemand
	for id, r := range e.demand {
		if t-r.at > req.Stale {
			delete(e.demand, id)
			continue
		}
		out = append(out, algo.SubscriberDemand{Subscriber: id, Demand: r.units})
	}
	slices.SortFunc(out, func(a, b algo.SubscriberDemand) int { return cmpInt(a.Subscriber, b.Subscriber) })
	return out
}

// returnable reports whether units granted in the window starting at ws
// still count at t: the window is the current one (fixed_window,
// sliding_window; a sliding window's earlier window counts at its weight
// and is left alone), or the limit is a token bucket.
func returnable(l algo.Limit, ws, t int64) bool {
	if l.Kind == algo.TokenBucket {
		return true
	}
	cur, _ := algo.WindowBoundsUs(l, t)
	return cur == ws
}

// sweep drops the keys that have no demand within their Stale left, and
// sets the next sweep at twice the size that remains.
func (lt *leaseTable) sweep(t int64) {
	for k, e := range lt.keys {
		for id, r := range e.demand {
			if t-r.at > e.stale {
				delete(e.demand, id)
			}
		}
		if len(e.demand) == 0 {
			delete(lt.keys, k)
		}
	}
	lt.sweepAt = max(1024, 2*len(lt.keys))
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
