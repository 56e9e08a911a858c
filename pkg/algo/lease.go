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
// grants min(want, what a check reports remaining) and takes that many as
// one allowed Take would, so that the units granted to every subscriber
// together never exceed the limit. It returns the next state, the units
// granted and the decision of a check on the next state (Remaining: what
// is left for other leases). want <= 0 grants nothing and leaves prev as
// it was. Units a subscriber does not use go back with Release.
func Lease(l Limit, prev State, now time.Time, want int64) (next State, granted int64, d Decision) {
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
	Subscriber int64
	Demand     int64
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
