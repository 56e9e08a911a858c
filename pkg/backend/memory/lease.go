package memory

import (
	"context"
	"slices"
	"sync"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// leaseTable holds the counters of leased limits and their subscribers'
// demand, apart from the shards: a lease is charged a few times per
// interval per key, not per request, so one lock suffices.
type leaseTable struct {
	mu   sync.Mutex
	keys map[string]*leased
	// sweepAt is the table size from which the next Lease drops the
	// entries that have expired.
	sweepAt int
}

// leased is one key's counter and its subscribers' last demands.
type leased struct {
	l      algo.Limit // of the last Lease
	st     algo.State
	stale  int64 // LeaseRequest.Stale of the last Lease
	demand map[int64]reported
}

// reported is a demand and when (µs) it was reported.
type reported struct{ units, at int64 }

// Lease does req atomically (one lock hold): it gives back req.Return
// units (algo.Release) when they were granted in the current window (any
// time for a token bucket), records the subscriber's demand, drops the
// demands older than req.Stale and charges up to req.Want units
// (algo.Lease). It never fails on a leasable limit.
//
// A new store starts every counter from zero, as the exact limits do:
// the leases and the store live in one process, so when the store is new
// no lease from before it is held anywhere (algo.Lease's bornUs is 0).
func (s *Store) Lease(_ context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	now := s.now()
	t := now.UnixMicro()
	lt := &s.leases
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
	l := req.Limit
	e.l, e.stale = l, req.Stale
	if req.Return > 0 && returnable(l, req.ReturnWindow, t) {
		e.st, _ = algo.Release(l, e.st, now, req.Return)
	}
	e.demand[req.Subscriber] = reported{units: max(req.Demand, 0), at: t}
	var g algo.LeaseGrant
	var d algo.Decision
	e.st, g.Granted, d = algo.Lease(l, e.st, now, req.Want, 0)
	g.Remaining, g.Now = d.Remaining, t
	for id, r := range e.demand {
		if t-r.at > req.Stale {
			delete(e.demand, id)
			continue
		}
		g.Demands = append(g.Demands, algo.SubscriberDemand{Subscriber: id, Demand: r.units})
	}
	slices.SortFunc(g.Demands, func(a, b algo.SubscriberDemand) int { return cmpInt(a.Subscriber, b.Subscriber) })
	return g, nil
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

// sweep drops the keys whose counter has expired and that have no demand
// left, and sets the next sweep at twice the size that remains.
func (lt *leaseTable) sweep(t int64) {
	for k, e := range lt.keys {
		for id, r := range e.demand {
			if t-r.at > e.stale {
				delete(e.demand, id)
			}
		}
		if len(e.demand) == 0 && algo.ExpiresAtUs(e.l, e.st) <= t {
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
