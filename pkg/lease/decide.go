package lease

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Take decides hits, all of leased limits, from the units this instance
// holds: no store round trip while a lease has the units. A lease that
// runs short is renewed; a hit that finds it empty waits for that renewal
// (up to ctx's deadline) unless the store said this window (or, for a
// sliding window and a token bucket, this interval) has nothing left,
// which is denied at once. The hits of one request are all-or-nothing: when
// one that is not Soft is denied, the units the others took go back to
// the lease. A release (Hit.Release) puts its units back into the lease.
//
// failed lists the hits that could not be decided: their lease is used up
// and its last renewal failed (err is that error), or ctx ended while
// they waited (err is ctx's error). The caller applies their failure
// mode.
func (ls *Leaser) Take(ctx context.Context, hits []algo.Hit) (out []algo.Decision, failed []int, err error) {
	out = make([]algo.Decision, len(hits))
	var taken []int
	var entries []*entry
	denied := false
	for i := range hits {
		h := &hits[i]
		e := ls.entryFor(h)
		entries = append(entries, e)
		if h.Release {
			out[i] = e.give(algo.ClampCost(h.Cost))
			continue
		}
		d, ferr := e.take(ctx, algo.ClampCost(h.Cost))
		if ferr != nil {
			failed = append(failed, i)
			err = ferr
			continue
		}
		out[i] = d
		if d.Allowed && h.Cost > 0 {
			taken = append(taken, i)
		}
		if !d.Allowed && !h.Soft {
			denied = true
		}
	}
	if denied {
		for _, i := range taken {
			d := entries[i].give(algo.ClampCost(hits[i].Cost))
			d.Remaining = out[i].Remaining
			out[i] = d
		}
	}
	return out, failed, err
}

// Undo gives back the units of the hits decs allowed (a request that a
// limit decided elsewhere denied): releases are not undone.
func (ls *Leaser) Undo(hits []algo.Hit, decs []algo.Decision) {
	for i := range hits {
		h := &hits[i]
		if h.Release || h.Cost <= 0 || !decs[i].Allowed {
			continue
		}
		ls.entryFor(h).give(algo.ClampCost(h.Cost))
	}
}

// take decides one hit of cost units (0: a check) from the lease.
func (e *entry) take(ctx context.Context, cost int64) (algo.Decision, error) {
	ls := e.ls
	need := max(cost, 1)
	for attempt := 0; ; attempt++ {
		e.mu.Lock()
		lt := ls.now()
		t := lt + ls.offset.Load()
		e.roll(t, lt)
		if attempt == 0 {
			e.asked += need
		}
		e.lastUse = lt
		if e.avail >= need {
			e.avail -= cost
			d := e.decision(true, t)
			if e.avail < (e.target+1)/2 && e.mayRenew(t, lt) {
				e.startRenew(t, lt)
			}
			e.mu.Unlock()
			ls.m.decided(1, 0)
			return d, nil
		}
		if t < e.exhaustedUntil {
			d := e.decision(false, t)
			e.mu.Unlock()
			ls.m.decided(0, 1)
			return d, nil
		}
		if e.failErr != nil && !e.renewing && (attempt > 0 || !e.mayRenew(t, lt)) {
			err := e.failErr
			e.mu.Unlock()
			return algo.Decision{}, err
		}
		if attempt >= 2 {
			d := e.decision(false, t)
			e.mu.Unlock()
			ls.m.decided(0, 1)
			return d, nil
		}
		if !e.renewing {
			e.startRenew(t, lt)
		}
		ch := e.renewed
		e.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return algo.Decision{}, ctx.Err()
		}
	}
}

// give puts n units back into the lease (same window) and returns the
// decision of a check.
func (e *entry) give(n int64) algo.Decision {
	e.mu.Lock()
	defer e.mu.Unlock()
	lt := e.ls.now()
	t := lt + e.ls.offset.Load()
	e.roll(t, lt)
	e.avail += n
	return e.decision(true, t)
}

// roll moves the lease to the window of t (store clock): units of an
// earlier window no longer count. It also closes the demand interval.
func (e *entry) roll(t, lt int64) {
	if e.l.Kind != algo.TokenBucket {
		p := e.l.Period.Microseconds()
		if ws := t - t%p; ws > e.ws {
			e.ws, e.avail = ws, 0
		}
	}
	if el := lt - e.since; el >= e.interval {
		e.demand = e.asked * e.interval / el
		e.asked, e.since = 0, lt
	}
}

// decision is the local view as a Decision: Remaining is the units held;
// a denial's RetryAfter is the end of the window (fixed_window), or when
// the store may have units again.
func (e *entry) decision(allowed bool, t int64) algo.Decision {
	d := algo.Decision{Allowed: allowed, Remaining: max(e.avail, 0)}
	reset := e.interval
	if e.l.Kind != algo.TokenBucket {
		reset = e.ws + e.l.Period.Microseconds() - t
	}
	d.ResetAfter = time.Duration(max(reset, 1)) * time.Microsecond
	d.WindowAfter = d.ResetAfter
	if !allowed {
		retry := e.interval
		switch {
		case e.l.Kind == algo.FixedWindow:
			retry = reset
		case e.exhaustedUntil > t:
			retry = e.exhaustedUntil - t
		}
		d.RetryAfter = time.Duration(max(retry, 1000)) * time.Microsecond
	}
	return d
}
