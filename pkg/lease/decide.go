package lease

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Take decides hits, all of leased limits, from the units this instance
// holds: no store round trip while a lease has the units. A lease that
// runs short is renewed; a hit that finds it empty waits for that renewal
// (up to half of what remains of ctx's deadline, at most Options.Timeout),
// unless the store said nothing is left this window, which is denied at
// once. The hits of one request are all-or-nothing, and a release puts
// its units back into the lease.
//
// undo gives back what the allowed hits took (for a request another
// limit denied), into the windows they took it from. failed lists the
// hits that could not be decided: their lease is used up and its last
// renewal failed (err is that error), the renewal they waited for did
// not end within their wait (err is ErrRenewalStalled), or ctx ended
// while they waited (err is ctx's error). The caller applies their
// failure mode.
func (ls *Leaser) Take(ctx context.Context, hits []algo.Hit) (out []algo.Decision, failed []int, undo func(), err error) {
	out = make([]algo.Decision, len(hits))
	type took struct {
		e     *entry
		i     int
		n, ws int64
	}
	var taken []took
	denied := false
	for i := range hits {
		h := &hits[i]
		e := ls.entryFor(h)
		if h.Release {
			out[i] = e.give(algo.ClampCost(h.Cost), -1)
			continue
		}
		d, ws, ferr := e.take(ctx, algo.ClampCost(h.Cost))
		if ferr != nil {
			failed = append(failed, i)
			err = ferr
			continue
		}
		out[i] = d
		if d.Allowed && h.Cost > 0 {
			taken = append(taken, took{e, i, algo.ClampCost(h.Cost), ws})
		}
		if !d.Allowed && !h.Soft {
			denied = true
		}
	}
	if denied {
		for _, tk := range taken {
			d := tk.e.give(tk.n, tk.ws)
			d.Remaining = out[tk.i].Remaining
			out[tk.i] = d
		}
		taken = nil
	}
	undo = func() {
		for _, tk := range taken {
			tk.e.give(tk.n, tk.ws)
		}
	}
	return out, failed, undo, err
}

// maxBehindAttempts bounds the renewals a hit waits for while the store
// is still in a window that has ended here (entry.behind).
const maxBehindAttempts = 16

// take decides one hit of cost units (0: a check) from the lease, and
// returns the window its units came from.
func (e *entry) take(ctx context.Context, cost int64) (algo.Decision, int64, error) {
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
			ws := e.ws
			e.mu.Unlock()
			ls.m.decided(1, 0)
			return d, ws, nil
		}
		if t < e.exhaustedUntil {
			d := e.decision(false, t)
			e.mu.Unlock()
			ls.m.decided(0, 1)
			return d, 0, nil
		}
		if e.failErr != nil && !e.renewing && (attempt > 0 || !e.mayRenew(t, lt)) {
			err := e.failErr
			e.mu.Unlock()
			return algo.Decision{}, 0, err
		}
		// A hit asks twice; more while the store lags behind this
		// window: it reaches it within a request's latency.
		if attempt >= 2 && (!e.behind || attempt >= maxBehindAttempts) {
			d := e.decision(false, t)
			e.mu.Unlock()
			ls.m.decided(0, 1)
			return d, 0, nil
		}
		if e.renewing && e.stalled {
			// A hit already waited its budget for this renewal in
			// vain: the store is not answering, do not wait again.
			e.mu.Unlock()
			return algo.Decision{}, 0, ErrRenewalStalled
		}
		if !e.renewing {
			e.startRenew(t, lt)
		}
		ch := e.renewed
		e.mu.Unlock()
		budget := ls.waitBudget(ctx)
		start := time.Now()
		wait := time.NewTimer(budget)
		stalled := false
		select {
		case <-ch:
			wait.Stop()
		case <-wait.C:
			stalled = true
		case <-ctx.Done():
			wait.Stop()
			// A late wake-up may find both ready and pick ctx: once
			// the wait budget has passed, the store is what did not
			// answer. The budget is read on the clock, not from Stop,
			// which reports an expired timer whose tick was not yet
			// received as stopped.
			if time.Since(start) < budget {
				return algo.Decision{}, 0, ctx.Err()
			}
			stalled = true
		}
		if stalled {
			e.mu.Lock()
			if e.renewed == ch {
				e.stalled = true
			}
			e.mu.Unlock()
			return algo.Decision{}, 0, ErrRenewalStalled
		}
	}
}

// ErrRenewalStalled is the error of a hit that found its lease empty and
// whose wait for the renewal in flight ran out (waitBudget): the store
// has not answered, so the rule's failure_mode decides the hit while the
// caller still has time for the answer. Its cause is "stalled", as for a
// store that went silent.
var ErrRenewalStalled error = stalledError{}

type stalledError struct{}

func (stalledError) Error() string {
	return "lease: the store did not answer the renewal within the hit's wait budget"
}

// Cause is the bounded metric label of the error.
func (stalledError) Cause() string { return "stalled" }

// waitBudget is how long a hit waits for a renewal: half of what remains
// of ctx's deadline, so that the other half is left to answer with the
// rule's failure_mode, and at most Options.Timeout, the renewal's own
// bound.
func (ls *Leaser) waitBudget(ctx context.Context) time.Duration {
	d := ls.opt.Timeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	return max(d, 0)
}

// give puts n units taken in the window ws back into the lease, unless
// that window has ended (a token bucket's units always count; ws -1: the
// current window, a refund), and returns the decision of a check.
func (e *entry) give(n, ws int64) algo.Decision {
	e.mu.Lock()
	defer e.mu.Unlock()
	lt := e.ls.now()
	t := lt + e.ls.offset.Load()
	e.roll(t, lt)
	if ws < 0 || e.l.Kind == algo.TokenBucket || ws == e.ws {
		e.avail += n
	}
	return e.decision(true, t)
}

// roll moves the lease to the window of t (store clock), dropping the
// units of an earlier window. It also closes the demand interval.
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
		// At most a window: t moves back when the clock estimate
		// falls, while ws never does.
		reset = min(e.ws+e.l.Period.Microseconds()-t, e.l.Period.Microseconds())
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
