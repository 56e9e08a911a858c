package algo

import "time"

// Leasable reports whether a limit can be enforced from leases (a rule's
// consistency: leased): fixed_window, sliding_window and token_bucket
// without calendar windows. The other kinds keep per-request state (a log
// of timestamps, concurrent leases) that units handed out in advance
// cannot represent.
func Leasable(l Limit) bool {
	return (l.Kind == FixedWindow || l.Kind == SlidingWindow || l.Kind == TokenBucket) && l.Calendar == CalendarNone
}

// Lease charges a lease of up to want units of l at now, up front: it
// grants min(want, what remains) and takes that many as one allowed Take
// would, so that the units granted to every subscriber together never
// exceed the limit. It returns the next state, the units granted and the
// decision of a check on the next state. Unused units go back with
// Release.
//
// bornUs is when the store's memory of the counters began (µs; 0 assumes
// nothing). Whatever window began before it is taken as full and a token
// bucket as empty at bornUs, because a restarted store forgot units that
// are still leased out; so a restart never lets a window admit more than
// the limit.
func Lease(l Limit, prev State, now time.Time, want, bornUs int64) (next State, granted int64, d Decision) {
	prev = assumeLost(l, prev, now.UnixMicro(), bornUs)
	st, chk := Take(l, prev, now, 0)
	g := min(max(want, 0), chk.Remaining, MaxCost)
	if g == 0 {
		return st, 0, chk
	}
	st, d = Take(l, st, now, g)
	if !d.Allowed { // cannot happen: g <= Remaining
		return prev, 0, chk
	}
	return st, g, d
}

// assumeLost is prev with what a store born at bornUs cannot know
// assumed the worst (see Lease).
func assumeLost(l Limit, prev State, t, bornUs int64) State {
	if bornUs <= 0 || l.Rate <= 0 {
		return prev
	}
	switch l.Kind {
	case FixedWindow, SlidingWindow:
		ws, _ := WindowBoundsUs(l, t)
		if prev.Time > ws {
			return prev
		}
		cur, pre := int64(0), int64(0)
		if prev.Time == ws {
			cur, pre = prev.Count, prev.Prev
		} else if ps, _ := WindowBoundsUs(l, ws-1); prev.Time == ps {
			pre = prev.Count
		}
		if ws < bornUs {
			cur = max(cur, l.Rate)
		} else if ps, _ := WindowBoundsUs(l, ws-1); l.Kind == SlidingWindow && ps < bornUs {
			pre = max(pre, l.Rate)
		}
		if l.Kind == FixedWindow {
			pre = 0
		}
		return State{Time: ws, Count: cur, Prev: pre}
	case TokenBucket:
		r, b, p := l.Rate, capacity(l), periodUs(l)
		q, m := p/r, p%r
		tat, frac := prev.Time, prev.Count
		if frac < 0 || frac >= r {
			tat, frac = tat+1, 0
		}
		et, ef := bornUs+b*q+(b*m)/r, (b*m)%r
		if tat < et || (tat == et && frac < ef) {
			return State{Time: et, Count: ef}
		}
	}
	return prev
}

// LeaseRequest is one subscriber's lease operation on one key: give back
// Return units of an earlier grant, record the subscriber's demand, and
// charge up to Want units (Lease). A store does all three atomically.
type LeaseRequest struct {
	// Key names the counter, as Hit.Key (the store derives its own keys
	// from it, e.g. with the window start).
	Key string
	// Limit is the leased limit (Leasable).
	Limit Limit
	// Subscriber identifies the caller among the subscribers of Key (a
	// ratelimitd instance, a cell); >= 1.
	Subscriber int64
	// Demand is the units the subscriber was asked for over its last
	// interval (admitted or not), shared with the other subscribers.
	Demand int64
	// Want is the units to charge; 0 records the demand and reads.
	Want int64
	// Return gives back units of an earlier grant that were not used:
	// for window kinds only when the grant's window (ReturnWindow) is
	// the current one; a token bucket gets them back whenever it is not
	// full.
	Return int64
	// ReturnWindow is the start (µs) of the window Return was granted in.
	ReturnWindow int64
	// Stale is how long (µs) a subscriber's demand counts after it was
	// reported; Demands lists only those reported within it.
	Stale int64
}

// SubscriberDemand is one subscriber's last reported demand.
type SubscriberDemand struct {
	// Subscriber is LeaseRequest.Subscriber of the report.
	Subscriber int64
	// Demand is its LeaseRequest.Demand (units per interval).
	Demand int64
}

// LeaseGrant is a store's answer to a LeaseRequest.
type LeaseGrant struct {
	// Granted is the units charged for the caller (<= Want).
	Granted int64
	// Remaining is what a check on the key reports after the grant:
	// the limit less what every subscriber holds or used.
	Remaining int64
	// Now is the store's instant of the operation (µs since the epoch):
	// the grant belongs to the window containing it.
	Now int64
	// Demands are the subscribers' demands reported within Stale,
	// the caller's included, in ascending Subscriber order.
	Demands []SubscriberDemand
}
