// Take: one request's hits decided on memcached within its budget, and
// the refunds that make a denied request consume nothing.

package memcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	gomemcache "github.com/bradfitz/gomemcache/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// budget is when a call started at start must return: start + Timeout, or
// earlier the caller's deadline less min(DeadlineMargin, a quarter of the
// time left).
func (s *Store) budget(ctx context.Context, start time.Time) time.Time {
	end := start.Add(s.timeout)
	if d, ok := ctx.Deadline(); ok {
		left := d.Sub(start)
		d = d.Add(-min(DeadlineMargin, left/4))
		if d.Before(end) {
			end = d
		}
	}
	return end
}

// request states: running, done (decide finished first), abandoned (the
// caller returned first).
const (
	reqRunning int32 = iota
	reqDone
	reqAbandoned
)

// request is one Take in flight.
type request struct {
	hits  []algo.Hit
	out   []algo.Decision
	err   error
	state atomic.Int32
	done  chan struct{}
}

// Take decides the hits of one request (service.Store), each a
// fixed_window limit, with one atomic INCR of its window's counter per hit
// (ADD for the window's first hit). When a hit that is not Soft denies,
// the request's counted hits are decremented again, so a denied request
// consumes nothing. Hits on different counters run in parallel, hits on
// one counter in order. Take returns by its budget with cause CauseTimeout
// when memcached has not answered (refunding what the late operations
// counted), and at once while the breaker is open. Denials in the local
// over-limit cache are answered without memcached. Errors are *Error.
func (s *Store) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	if len(hits) == 0 {
		return nil
	}
	for _, h := range hits {
		if h.Limit.Kind != algo.FixedWindow {
			return newError(CauseUnsupported, false, fmt.Errorf("algorithm %d: only fixed_window is supported", h.Limit.Kind))
		}
	}
	return s.cache.Take(ctx, hits, out, s.now, s.take)
}

// take decides hits (all fixed_window) on memcached, without the local
// cache, into out.
func (s *Store) take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	start := time.Now()
	end := s.budget(ctx, start)
	if !end.After(start) {
		return errTimeout
	}
	guarded := s.guarded()
	at := s.clk.Now() // the breaker's time of the call
	if guarded {
		if err := s.breaker.Allow(at); err != nil {
			return err
		}
	}
	// decide may outlive the call (see below): it keeps its own copies of
	// hits and of the decisions, whose backing arrays the caller may
	// reuse, and out receives the decisions only once they stand.
	r := &request{hits: append([]algo.Hit(nil), hits...), out: make([]algo.Decision, len(hits)), done: make(chan struct{})}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.decide(r)
	}()
	t := time.NewTimer(end.Sub(start))
	defer t.Stop()
	var err error
	select {
	case <-r.done:
		err = r.err
	case <-t.C:
		err = errTimeout
	case <-ctx.Done():
		err = Classify(ctx.Err())
	}
	if err != nil && !r.state.CompareAndSwap(reqRunning, reqAbandoned) {
		// decide finished meanwhile: its outcome stands.
		<-r.done
		err = r.err
	}
	// What the breaker records: the outcome, but a budget that the
	// caller's deadline cut short (or the caller's context that ran out)
	// is no proof of a stall.
	rec := err
	if errors.Is(err, errTimeout) && !end.Equal(start.Add(s.timeout)) || errors.Is(err, context.DeadlineExceeded) {
		rec = errBudgetCut
	}
	if guarded {
		s.breaker.RecordSince(at, s.clk.Now(), rec)
	}
	if err != nil {
		if errors.Is(rec, errTimeout) {
			// memcached was silent for a whole Timeout. A budget cut
			// short by the caller's deadline proves less (the probe
			// decides then).
			s.note(err)
		}
		return err
	}
	copy(out, r.out)
	return nil
}

// taken records what decide counted for one hit.
type taken struct {
	key  string // counter key
	cost int64  // units counted by INCR and not refunded (0: none)
	// prev is the counter's value before this hit (the INCR's result
	// less cost, or the GET's value).
	prev  int64
	start int64 // window start, µs
	first int   // index of the request's first hit on this counter
	// kept: an always_charge hit (algo.Hit.Kept) whose cost stays counted
	// when the request is denied.
	kept bool
}

// decide runs the request's operations and sets r.out and r.err, then
// closes r.done. When the caller gave up first, everything counted is
// refunded.
func (s *Store) decide(r *request) {
	defer close(r.done)
	now := s.now()
	nowUs := now.UnixMicro()
	tk := make([]taken, len(r.hits))
	// One goroutine per counter beyond the first, hits of one counter in
	// request order.
	groups, order := groupByCounter(r.hits, nowUs, tk)
	errs := make([]error, len(order))
	run := func(gi int) {
		for _, i := range groups[order[gi]] {
			if r.state.Load() == reqAbandoned {
				errs[gi] = errAbandoned
				return
			}
			if err := s.decideHit(r.hits[i], now, nowUs, &tk[i], &r.out[i]); err != nil {
				errs[gi] = err
				return
			}
		}
	}
	if len(order) == 1 {
		run(0)
	} else {
		var wg sync.WaitGroup
		for gi := 1; gi < len(order); gi++ {
			wg.Go(func() { run(gi) })
		}
		run(0)
		wg.Wait()
	}
	var err error
	for _, e := range errs {
		if e != nil {
			err = e
			break
		}
	}
	denied := false
	for i, d := range r.out {
		if !d.Allowed && !r.hits[i].Soft {
			denied = true
		}
	}
	switch {
	case err == nil && !denied:
		if !r.state.CompareAndSwap(reqRunning, reqDone) {
			// The caller gave up (its failure mode applied): the request
			// consumes nothing.
			s.refundAll(tk, false)
		}
	case err == nil:
		// Denied: what the request counted is refunded, but for its
		// always_charge hits (refunds are never undone).
		s.refundAll(tk, true)
	default:
		s.refundAll(tk, false)
	}
	if err == nil && denied {
		// Hits that did not deny report the value before the request;
		// kept hits (refunds, always_charge) their own decision.
		for i, d := range r.out {
			if d.Allowed && !r.hits[i].Kept() {
				_, r.out[i] = algo.Take(r.hits[i].Limit, algo.State{Time: tk[i].start, Count: tk[tk[i].first].prev}, now, 0)
			}
		}
	}
	s.note(err)
	r.err = err
	r.state.CompareAndSwap(reqRunning, reqDone)
}

// groupByCounter sets tk[i] (its counter key, window start and the index
// of the request's first hit on that counter) for every hit at nowUs, and
// returns the indices of the hits of each counter, in request order, and
// the counters in the order of their first hit.
func groupByCounter(hits []algo.Hit, nowUs int64, tk []taken) (groups map[string][]int, order []string) {
	groups = map[string][]int{}
	for i, h := range hits {
		st, _ := algo.WindowBoundsUs(h.Limit, nowUs)
		k := CounterKey(h.Key, st)
		tk[i] = taken{key: k, start: st, first: i}
		if g, ok := groups[k]; ok {
			tk[i].first = g[0]
		} else {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	return groups, order
}

// refundAll decrements every counter by what the request counted on it,
// but for the kept (always_charge) hits when keepKept.
func (s *Store) refundAll(tk []taken, keepKept bool) {
	for i := range tk {
		if tk[i].cost > 0 && (!keepKept || !tk[i].kept) {
			if _, err := s.client.Decrement(tk[i].key, uint64(tk[i].cost)); err != nil && !errors.Is(err, gomemcache.ErrCacheMiss) {
				s.refundErrors.Add(1)
			}
			tk[i].cost = 0
		}
	}
}

// decideHit decides one hit: a read for checks and costs above the
// limit, else INCR (ADD on a new counter), decremented again when denied
// unless the hit is always_charge (algo.Charge: then also for costs
// above the limit). A refund (algo.Release) is a DECR, which memcached
// floors at 0 as algo.Release floors a fixed window's count, reported as
// an allowed check on the new value.
func (s *Store) decideHit(h algo.Hit, now time.Time, nowUs int64, t *taken, out *algo.Decision) error {
	l := h.Limit
	cost := algo.ClampCost(h.Cost)
	if h.Release {
		var v int64
		var err error
		if cost > 0 && l.Rate > 0 {
			v, err = s.decr(t.key, cost)
		} else {
			v, err = s.get(t.key)
		}
		if err != nil {
			return err
		}
		t.prev = v
		_, *out = algo.Take(l, algo.State{Time: t.start, Count: v}, now, 0)
		out.Allowed, out.RetryAfter = true, 0
		return nil
	}
	charge := h.Charge && l.Rate > 0
	if cost == 0 || (cost > l.Rate && !charge) {
		v, err := s.get(t.key)
		if err != nil {
			return err
		}
		t.prev = v
		_, *out = algo.Take(l, algo.State{Time: t.start, Count: v}, now, cost)
		return nil
	}
	_, end := algo.WindowBoundsUs(l, nowUs)
	v, err := s.incr(t.key, cost, expiration(nowUs, end, s.slack))
	if err != nil {
		return err
	}
	prev := max(v-cost, 0)
	t.prev = prev
	var d algo.Decision
	if charge {
		_, d = algo.Charge(l, algo.State{Time: t.start, Count: prev}, now, cost)
	} else {
		_, d = algo.Take(l, algo.State{Time: t.start, Count: prev}, now, cost)
	}
	*out = d
	if d.Allowed || charge {
		t.cost, t.kept = cost, charge
		return nil
	}
	// Denied: this hit consumes nothing.
	if _, err := s.client.Decrement(t.key, uint64(cost)); err != nil && !errors.Is(err, gomemcache.ErrCacheMiss) {
		s.refundErrors.Add(1)
	}
	return nil
}
