package rlqs

import (
	"context"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// LeaseStore charges leases up front (algo.LeaseRequest): the memory and
// Redis stores, on the counters Store.Take decides.
type LeaseStore interface {
	// Lease does req atomically.
	Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error)
}

// A token-bucket assignment is a lease: what the local buckets on a
// counter may admit until the next round (each bucket full plus one
// interval of its rate) is charged to the store up front, in the current
// window, by one lease operation per counter and round, which also gives
// back what the buckets did not use of the last one (their usage reports
// say what they used). ShouldRateLimit on the same counter sees the
// Envoys' reserved budget at once, and a bucket whose counter has nothing
// left is sent DENY_ALL, in its first answer too.

// leased reports whether the usage on ks is reserved up front
// (Options.Leases set, a fixed window on the backend without a penalty box)
// rather than charged after the fact. A window longer than the TTL is a
// budget (planFor) and is not leased: a store's lease takes a window that
// began before the store's memory did as full, which would deny a day's
// budget after a restart until the day ends.
func (s *Server) leased(ks *keyState) bool {
	sp := ks.spec
	if s.opt.Leases == nil || sp.Store == policy.StoreDurable || !algo.Leasable(sp.Limit) {
		return false
	}
	return sp.Limit.Kind == algo.FixedWindow && !ks.penalty && window(sp) <= s.TTL()
}

// subscriber is this replica's lease subscriber id (>= 1), from its name.
func (s *Server) subscriber() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.opt.Replica))
	return int64(h.Sum64()&(1<<52-1)) + 1
}

// settle takes what the reservations of ks cover out of its pending
// usage and returns what is left of them to give back: usage is taken
// from the oldest first, so what is left is of the latest, and only the
// part granted in the latest window (heldNow) can go back to it. Under
// s.mu.
func settle(ks *keyState) (ret, ws int64) {
	covered := min(ks.pending, ks.held)
	ks.pending -= covered
	ret, ws = min(ks.held-covered, ks.heldNow), ks.heldWS
	ks.held, ks.heldNow = 0, 0
	return ret, ws
}

// reservation is one counter's lease operation of a round or a join.
type reservation struct {
	key     string
	spec    *policy.Spec
	want    int64
	tokens  int64 // the part of want that is the buckets' tokens
	ret     int64 // unused units of the last grant
	retWS   int64 // the window they were granted in
	granted int64
	ws      int64 // the window of the grant
	err     error
}

// reservations lists, per leased counter of per, the units its limited
// buckets' shares may admit until the next round: each bucket full plus
// one interval of its rate. ret gives the unused units of the last grant
// back (settle). Under s.mu.
func (s *Server) reservations(per map[string]map[*bucket]share, ret map[string][2]int64) []*reservation {
	var out []*reservation
	all := combined(per)
	for _, k := range slices.Sorted(maps.Keys(per)) {
		ks := s.keys[k]
		if ks == nil || !s.leased(ks) {
			continue
		}
		r := &reservation{key: k, spec: ks.spec, ret: ret[k][0], retWS: ret[k][1]}
		// What a bucket admits is its assignment, the stricter of its
		// shares: a day's budget next to a per-second limit reserves what
		// the per-second share admits. The refill is summed before it is
		// rounded up, so that the rounding costs one unit per counter, not
		// one per bucket.
		var refill float64
		for b := range per[k] {
			if sh := all[b]; b.kind == kindLimited && !sh.deny {
				if tokens, fill := admissible(sh, s.opt.Interval); fill > 0 {
					r.tokens += tokens
					refill += fill
				}
			}
		}
		r.want = r.tokens + int64(math.Ceil(refill))
		out = append(out, r)
	}
	return out
}

// admissible is what a bucket of share sh may admit over interval: its
// tokens full, plus the refill of interval at its rate. A bucket assigned no rate (a
// stream without demand, idleTokens) refills one token a day: its token is
// not reserved each round, and it may admit that one token unreserved
// (docs/rlqs.md, "RLQS and ShouldRateLimit on one rule").
func admissible(sh share, interval time.Duration) (tokens int64, refill float64) {
	if sh.rate <= 0 {
		return 0, 0
	}
	return max(sh.maxTokens, 1), float64(sh.rate) / milli * interval.Seconds() / sh.window.Seconds()
}

// maxLeaseCalls bounds a round's (or a join's) lease calls in flight at
// once. Each counter's lease is its own atomic store call, so the calls
// overlap freely: a round of many counters costs about its slowest call,
// not their sum, and the bound keeps a large round from taking every
// connection of the store's pool.
const maxLeaseCalls = 64

// reserve does the lease operations of rs, one store call each, up to
// maxLeaseCalls at once, in the order of rs, within ctx; a failed one is
// counted under op (reserve: a round's; reserve_join: a new bucket's,
// within joinTimeout) and left with its error, the others go on. It
// returns when every call it started has returned.
func (s *Server) reserve(ctx context.Context, op string, rs []*reservation) {
	sub := s.subscriber()
	slots := make(chan struct{}, maxLeaseCalls)
	var wg sync.WaitGroup
	for _, r := range rs {
		if r.want == 0 && r.ret == 0 {
			continue
		}
		taken := false
		select {
		case slots <- struct{}{}:
			taken = true
		case <-ctx.Done():
		}
		if r.err = ctx.Err(); r.err != nil {
			// Out of budget: no call is made; a slot taken is given back.
			if taken {
				<-slots
			}
			s.m.errors.WithLabelValues(op).Inc()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			g, err := s.opt.Leases.Lease(ctx, algo.LeaseRequest{Key: r.key, Limit: r.spec.Limit, Subscriber: sub,
				Want: r.want, Return: r.ret, ReturnWindow: r.retWS, Stale: 1})
			if err != nil {
				r.err = err
				s.m.errors.WithLabelValues(op).Inc()
				return
			}
			r.granted = g.Granted
			r.ws, _ = algo.WindowBoundsUs(r.spec.Limit, g.Now)
		}()
	}
	wg.Wait()
}

// applyGrants fits the shares of per to what rs granted: a counter
// granted nothing denies its buckets, one granted less than it asked for
// scales its buckets down in proportion; a failed lease applies the
// limit's failure_mode (closed: DENY_ALL; else the usage is charged after
// the fact). The grants become the counters' reservations. Under s.mu.
func (s *Server) applyGrants(per map[string]map[*bucket]share, rs []*reservation, join bool) {
	all := combined(per)
	for _, r := range rs {
		if r.err != nil {
			s.warn("reserve", "rlqs: budget not reserved; each rule's failure_mode applies, usage charged after the fact", "err", r.err)
			if r.spec.FailureMode == policy.FailClosed {
				for b, sh := range per[r.key] {
					sh.deny = true
					per[r.key][b] = sh
				}
			}
			continue
		}
		if ks := s.keys[r.key]; ks != nil {
			switch {
			case !join:
				ks.held, ks.heldNow, ks.heldWS = r.granted, r.granted, r.ws
			case ks.heldWS == r.ws:
				ks.held += r.granted
				ks.heldNow += r.granted
			default:
				ks.held += r.granted
				ks.heldNow, ks.heldWS = r.granted, r.ws
			}
		}
		if r.granted >= r.want {
			continue
		}
		// The bucket's assignment (the stricter of its shares), scaled,
		// becomes its share on this counter. The rates are scaled first:
		// a bucket cut below minTokens loses the refill while it is full
		// between two requests (minTokens), so the buckets keep their
		// tokens while the grant covers them.
		ft, fr := 1.0, 0.0
		if r.granted < r.tokens {
			ft = float64(r.granted) / float64(r.tokens)
		} else if r.want > r.tokens {
			fr = float64(r.granted-r.tokens) / float64(r.want-r.tokens)
		}
		for b := range per[r.key] {
			sh := all[b]
			if r.granted == 0 {
				sh.deny = true
			} else {
				sh.maxTokens = max(1, int64(float64(sh.maxTokens)*ft))
				sh.rate = int64(float64(sh.rate) * fr)
			}
			per[r.key][b] = sh
		}
	}
}

// reserveJoin reserves the shares of the new buckets fresh (per: their
// counters' division) before their first answer, within joinTimeout. When
// a counter of per is leased, only the new buckets are answered: the
// others keep the assignments their reservations cover until the next
// round. Called and returns under s.mu, which it releases meanwhile.
func (s *Server) reserveJoin(per map[string]map[*bucket]share, fresh []*bucket) {
	isFresh := make(map[*bucket]bool, len(fresh))
	for _, b := range fresh {
		isFresh[b] = true
	}
	leasedAny := false
	for k := range per {
		if ks := s.keys[k]; ks != nil && s.leased(ks) {
			leasedAny = true
		}
	}
	if !leasedAny {
		return
	}
	for k, m := range per {
		for b := range m {
			if !isFresh[b] {
				delete(m, b)
			}
		}
		if len(m) == 0 {
			delete(per, k)
		}
	}
	rs := s.reservations(per, nil)
	if len(rs) == 0 {
		return
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), min(s.joinTimeout, s.roundTimeout))
	s.reserve(ctx, "reserve_join", rs)
	cancel()
	s.mu.Lock()
	s.applyGrants(per, rs, true)
}
