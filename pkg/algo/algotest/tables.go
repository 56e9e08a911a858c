package algotest

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

const (
	us  = time.Microsecond
	ms  = time.Millisecond
	sec = time.Second
	day = 24 * time.Hour
)

// Tables returns the conformance tables. Every expected value is derived by
// hand from the formulas in pkg/algo's porting contract (comments show the
// arithmetic where it is not obvious).
func Tables() []Table {
	fixed := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Minute}
	fixed10 := algo.Limit{Kind: algo.FixedWindow, Rate: 2, Period: 10 * sec} // unit second × 10
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 1, Period: sec, Burst: 3}
	tb3 := algo.Limit{Kind: algo.TokenBucket, Rate: 3, Period: sec}
	tb10 := algo.Limit{Kind: algo.TokenBucket, Rate: 5, Period: 10 * sec} // unit second × 10
	sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 10, Period: time.Minute}
	sl := algo.Limit{Kind: algo.SlidingLog, Rate: 3, Period: 10 * sec}
	cc := algo.Limit{Kind: algo.Concurrency, Rate: 2, Period: 30 * sec}
	month := algo.Limit{Kind: algo.FixedWindow, Rate: 2, Period: 30 * day, Calendar: algo.CalendarMonth, Multiplier: 1}
	year2 := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: 365 * day, Calendar: algo.CalendarYear, Multiplier: 2}
	swMonth := algo.Limit{Kind: algo.SlidingWindow, Rate: 2, Period: 30 * day, Calendar: algo.CalendarMonth, Multiplier: 1}
	endJan := time.Date(2026, 1, 31, 23, 59, 59, 0, time.UTC)
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	mid2027 := time.Date(2027, 7, 1, 0, 0, 0, 0, time.UTC)

	ts := []Table{
		{Name: "fixed_window", Steps: []Step{
			one(0, "k", fixed, 1, OK(2, 60*sec, 60*sec)),
			one(1*sec, "k", fixed, 1, OK(1, 59*sec, 59*sec)),
			one(2*sec, "k", fixed, 1, OK(0, 58*sec, 58*sec)), // Nth passes
			one(3*sec, "k", fixed, 1, Deny(0, 57*sec, 57*sec, 57*sec)),
			one(3*sec, "k", fixed, 0, Deny(0, 57*sec, 57*sec, 57*sec)), // check: nothing left
			one(60*sec, "k", fixed, 1, OK(2, 60*sec, 60*sec)),          // rollover
			one(61*sec, "k", fixed, 3, Deny(2, 59*sec, 59*sec, 59*sec)),
			one(61*sec, "k", fixed, 4, Deny(2, 59*sec, 59*sec, 59*sec)), // above capacity
			one(61*sec, "k", fixed, 0, OK(2, 59*sec, 59*sec)),
			// clock back into the previous window: the later window's count holds
			one(50*sec, "k", fixed, 2, OK(0, 70*sec, 70*sec)),
			one(55*sec, "k", fixed, 1, Deny(0, 65*sec, 65*sec, 65*sec)),
			one(119*sec, "k", fixed, 1, Deny(0, sec, sec, sec)),
			one(10*time.Hour, "k", fixed, 3, OK(0, 60*sec, 60*sec)), // long idle
		}},
		{Name: "fixed_window_multiplier", Steps: []Step{
			one(7*sec, "k", fixed10, 2, OK(0, 3*sec, 3*sec)),
			one(9*sec, "k", fixed10, 1, Deny(0, sec, sec, sec)),
			one(10*sec, "k", fixed10, 1, OK(1, 10*sec, 10*sec)),
		}},
		{Name: "fixed_window_same_instant", Steps: []Step{
			one(5*sec, "k", fixed, 1, OK(2, 55*sec, 55*sec)),
			one(5*sec, "k", fixed, 1, OK(1, 55*sec, 55*sec)),
			one(5*sec, "k", fixed, 1, OK(0, 55*sec, 55*sec)),
			one(5*sec, "k", fixed, 1, Deny(0, 55*sec, 55*sec, 55*sec)),
		}},
		{Name: "calendar_month", Steps: []Step{
			oneAbs(endJan, "k", month, 2, OK(0, sec, sec)),
			oneAbs(endJan, "k", month, 1, Deny(0, sec, sec, sec)),
			oneAbs(feb, "k", month, 1, OK(1, 28*day, 28*day)), // February 2026 has 28 days
		}},
		{Name: "calendar_year", Steps: []Step{
			// years 2026-2027 form one window (years counted from 1970, × 2)
			oneAbs(mid2027, "k", year2, 1, OK(0, 184*day, 184*day)),
			oneAbs(mid2027.Add(100*day), "k", year2, 1, Deny(0, 84*day, 84*day, 84*day)),
			oneAbs(time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC), "k", year2, 1, OK(0, 731*day, 731*day)),
		}},
		{Name: "token_bucket", Steps: []Step{
			one(0, "k", tb, 0, OK(3, 0, sec)),
			one(0, "k", tb, 1, OK(2, sec, sec)),
			one(0, "k", tb, 2, OK(0, 3*sec, sec)), // Nth passes (same instant)
			one(0, "k", tb, 1, Deny(0, sec, 3*sec, sec)),
			one(0, "k", tb, 0, Deny(0, sec, 3*sec, sec)),
			one(500*ms, "k", tb, 1, Deny(0, 500*ms, 2500*ms, 500*ms)),
			one(500*ms, "k", tb, 4, Deny(0, sec, 2500*ms, 500*ms)), // above capacity: never, RetryAfter = Period
			one(1*sec, "k", tb, 1, OK(0, 3*sec, sec)),
			// TAT 4 s at 2.5 s: slack 1.5 s = 1 token; 2 need 0.5 s more
			one(2500*ms, "k", tb, 2, Deny(1, 500*ms, 1500*ms, 500*ms)),
			one(2500*ms, "k", tb, 1, OK(0, 2500*ms, 500*ms)),
			// clock back to 1 s: TAT 5 s, slack -1 s: nothing extra
			one(1*sec, "k", tb, 1, Deny(0, 2*sec, 4*sec, 2*sec)),
			one(time.Hour, "k", tb, 3, OK(0, 3*sec, sec)), // long idle: capped at capacity
			one(time.Hour, "k", tb, 1, Deny(0, sec, 3*sec, sec)),
		}},
		{Name: "token_bucket_fractional_emission", Steps: []Step{
			// 3 per second: T = 333333 1/3 µs
			one(0, "k", tb3, 3, OK(0, sec, 333334*us)),
			one(0, "k", tb3, 1, Deny(0, 333334*us, sec, 333334*us)),
			one(333333*us, "k", tb3, 1, Deny(0, 1*us, 666667*us, 1*us)),
			one(333334*us, "k", tb3, 1, OK(0, sec, 333333*us)),
			// at 1 s two tokens are back (TAT = 1333333 1/3 µs)
			one(sec, "k", tb3, 1, OK(1, 666667*us, 333334*us)),
			one(sec, "k", tb3, 1, OK(0, sec, 333334*us)), // TAT = exactly 2 s
			one(sec, "k", tb3, 1, Deny(0, 333334*us, sec, 333334*us)),
		}},
		{Name: "token_bucket_multiplier", Steps: []Step{
			// 5 per 10 s: T = 2 s
			one(0, "k", tb10, 5, OK(0, 10*sec, 2*sec)),
			one(1*sec, "k", tb10, 1, Deny(0, sec, 9*sec, sec)),
			one(2*sec, "k", tb10, 1, OK(0, 10*sec, 2*sec)),
		}},
		{Name: "sliding_window", Steps: []Step{
			one(30*sec, "k", sw, 10, OK(0, 90*sec, 36*sec)), // next unit at 66 s: 10*(54/60) = 9
			one(30*sec, "k", sw, 1, Deny(0, 36*sec, 90*sec, 36*sec)),
			one(30*sec, "k", sw, 0, Deny(0, 36*sec, 90*sec, 36*sec)),
			one(60*sec, "k", sw, 1, Deny(0, 6*sec, 60*sec, 6*sec)), // prev weighs 1 at the window start
			one(66*sec, "k", sw, 1, OK(0, 114*sec, 6*sec)),         // 10*0.9 + 0 <= 9
			one(90*sec, "k", sw, 0, OK(4, 90*sec, 6*sec)),          // 10*0.5 + 1 = 6
			one(90*sec, "k", sw, 5, Deny(4, 6*sec, 90*sec, 6*sec)),
			one(90*sec, "k", sw, 11, Deny(4, 30*sec, 90*sec, 6*sec)), // above capacity
			one(90*sec, "k", sw, 4, OK(0, 90*sec, 6*sec)),
			// clock back to 59 s: evaluated at the stored window's start (weight 1): 10 + 5
			one(59*sec, "k", sw, 1, Deny(0, 37*sec, 121*sec, 37*sec)),
			one(time.Hour, "k", sw, 10, OK(0, 120*sec, 66*sec)), // long idle
		}},
		{Name: "sliding_window_calendar_month", Steps: []Step{
			// January has 31 days, February 28: the next unit comes when 2*(w) <= 1, w = 1/2 of February
			oneAbs(endJan, "k", swMonth, 2, OK(0, 28*day+sec, 14*day+sec)),
			oneAbs(feb, "k", swMonth, 1, Deny(0, 14*day, 28*day, 14*day)),
			oneAbs(feb.Add(14*day), "k", swMonth, 1, OK(0, 45*day, 14*day)),
		}},
		{Name: "sliding_log", Steps: []Step{
			one(0, "k", sl, 1, OK(2, 10*sec, 10*sec)),
			one(1*sec, "k", sl, 1, OK(1, 10*sec, 9*sec)),
			one(2*sec, "k", sl, 1, OK(0, 10*sec, 8*sec)),
			one(5*sec, "k", sl, 1, Deny(0, 5*sec, 7*sec, 5*sec)),
			one(5*sec, "k", sl, 0, Deny(0, 5*sec, 7*sec, 5*sec)),
			one(10*sec, "k", sl, 1, OK(0, 10*sec, sec)), // the entry at 0 left the window
			one(10*sec, "k", sl, 2, Deny(0, 2*sec, 10*sec, sec)),
			one(11*sec, "k", sl, 4, Deny(1, 10*sec, 9*sec, sec)), // above capacity
			one(11*sec, "k", sl, 0, OK(1, 9*sec, sec)),
			one(3*sec, "k", sl, 1, Deny(0, 8*sec, 17*sec, 8*sec)), // clock back: later entries count
			one(time.Hour, "k", sl, 3, OK(0, 10*sec, 10*sec)),
		}},
		{Name: "sliding_log_same_instant", Steps: []Step{
			one(0, "k", sl, 2, OK(1, 10*sec, 10*sec)),
			one(0, "k", sl, 1, OK(0, 10*sec, 10*sec)),
			one(0, "k", sl, 1, Deny(0, 10*sec, 10*sec, 10*sec)),
			one(10*sec, "k", sl, 3, OK(0, 10*sec, 10*sec)), // all three expire together
		}},
		{Name: "concurrency", Steps: []Step{
			one(0, "k", cc, 1, OK(1, 30*sec, 30*sec)),
			one(1*sec, "k", cc, 1, OK(0, 30*sec, 29*sec)),
			one(2*sec, "k", cc, 1, Deny(0, 28*sec, 29*sec, 28*sec)),
			rel(3*sec, "k", cc, 1, OK(1, 28*sec, 28*sec)), // the oldest lease (0 s) goes
			one(4*sec, "k", cc, 1, OK(0, 30*sec, 27*sec)),
			one(5*sec, "k", cc, 3, Deny(0, 30*sec, 29*sec, 26*sec)), // above capacity
			rel(5*sec, "k", cc, 5, OK(2, 0, 30*sec)),                // more than held: all
			one(6*sec, "k", cc, 2, OK(0, 30*sec, 30*sec)),
			one(36*sec, "k", cc, 0, OK(2, 0, 30*sec)), // expired without release
			rel(36*sec, "k", cc, 1, OK(2, 0, 30*sec)),
		}},
		{Name: "rate_zero", Steps: []Step{
			one(10*sec, "f", algo.Limit{Kind: algo.FixedWindow, Period: time.Minute}, 1, Deny(0, 50*sec, 50*sec, 50*sec)),
			one(10*sec, "f", algo.Limit{Kind: algo.FixedWindow, Period: time.Minute}, 0, Deny(0, 50*sec, 50*sec, 50*sec)),
			one(10*sec, "w", algo.Limit{Kind: algo.SlidingWindow, Period: time.Minute}, 1, Deny(0, 50*sec, 50*sec, 50*sec)),
			one(10*sec, "l", algo.Limit{Kind: algo.SlidingLog, Period: time.Minute}, 1, Deny(0, time.Minute, time.Minute, time.Minute)),
			one(10*sec, "t", algo.Limit{Kind: algo.TokenBucket, Period: time.Minute}, 0, Deny(0, time.Minute, time.Minute, time.Minute)),
			one(10*sec, "c", algo.Limit{Kind: algo.Concurrency, Period: time.Minute}, 1, Deny(0, time.Minute, time.Minute, time.Minute)),
		}},
		multiHit(),
		refunds(),
		alwaysCharge(),
		alwaysChargeMultiHit(),
	}
	ts = append(ts, fractional()...)
	ts = append(ts, penaltyTables()...)
	return ts
}

// multiHit: all-or-nothing across the hits of one request.
func multiHit() Table {
	a := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}
	b := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Minute}
	t := algo.Limit{Kind: algo.TokenBucket, Rate: 1, Period: sec, Burst: 2}
	l := algo.Limit{Kind: algo.SlidingLog, Rate: 1, Period: 10 * sec}
	k := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Minute}
	c := algo.Limit{Kind: algo.Concurrency, Rate: 1, Period: time.Minute}
	h := func(key string, l algo.Limit, cost int64) algo.Hit { return algo.Hit{Key: key, Limit: l, Cost: cost} }
	soft := func(x algo.Hit) algo.Hit { x.Soft = true; return x }
	return Table{Name: "multi_hit", Steps: []Step{
		{At: 0, Hits: []algo.Hit{h("a", a, 1), h("b", b, 1)}, Want: []algo.Decision{OK(4, 60*sec, 60*sec), OK(0, 60*sec, 60*sec)}},
		// b denies: a consumes nothing and reports the value before the request
		{At: 1 * sec, Hits: []algo.Hit{h("a", a, 1), h("b", b, 1)}, Want: []algo.Decision{OK(4, 59*sec, 59*sec), Deny(0, 59*sec, 59*sec, 59*sec)}},
		{At: 1 * sec, Hits: []algo.Hit{h("a", a, 0)}, Want: []algo.Decision{OK(4, 59*sec, 59*sec)}},
		// other algorithms: the token bucket and the log keep their state
		{At: 2 * sec, Hits: []algo.Hit{h("t", t, 1), h("l", l, 1)}, Want: []algo.Decision{OK(1, sec, sec), OK(0, 10*sec, 10*sec)}},
		{At: 3 * sec, Hits: []algo.Hit{h("t", t, 2), h("l", l, 1)}, Want: []algo.Decision{OK(2, 0, sec), Deny(0, 9*sec, 9*sec, 9*sec)}},
		{At: 3 * sec, Hits: []algo.Hit{h("t", t, 2)}, Want: []algo.Decision{OK(0, 2*sec, sec)}},
		// the same key twice: applied in order, the second sees the first
		{At: 4 * sec, Hits: []algo.Hit{h("k", k, 1), h("k", k, 1)}, Want: []algo.Decision{OK(2, 56*sec, 56*sec), OK(1, 56*sec, 56*sec)}},
		// the second denies against the first's tentative state; nothing is written
		{At: 5 * sec, Hits: []algo.Hit{h("k", k, 1), h("k", k, 1)}, Want: []algo.Decision{OK(1, 55*sec, 55*sec), Deny(0, 55*sec, 55*sec, 55*sec)}},
		{At: 5 * sec, Hits: []algo.Hit{h("k", k, 0)}, Want: []algo.Decision{OK(1, 55*sec, 55*sec)}},
		// a denied check (cost 0) denies the request: a consumes nothing
		{At: 6 * sec, Hits: []algo.Hit{h("a", a, 1), h("b", b, 0)}, Want: []algo.Decision{OK(4, 54*sec, 54*sec), Deny(0, 54*sec, 54*sec, 54*sec)}},
		// a Soft hit (shadow, quota) that denies does not roll the request back: a consumes
		{At: 6 * sec, Hits: []algo.Hit{h("a", a, 1), soft(h("b", b, 1))}, Want: []algo.Decision{OK(3, 54*sec, 54*sec), Deny(0, 54*sec, 54*sec, 54*sec)}},
		// ... and a Soft hit that is allowed is rolled back with the rest when a hard hit denies
		{At: 6 * sec, Hits: []algo.Hit{soft(h("a", a, 1)), h("b", b, 1)}, Want: []algo.Decision{OK(3, 54*sec, 54*sec), Deny(0, 54*sec, 54*sec, 54*sec)}},
		{At: 6 * sec, Hits: []algo.Hit{h("a", a, 0)}, Want: []algo.Decision{OK(3, 54*sec, 54*sec)}},
		// a lease and a denied hit: the lease is not taken
		{At: 7 * sec, Hits: []algo.Hit{h("c", c, 1), h("b", b, 1)}, Want: []algo.Decision{OK(1, 0, 60*sec), Deny(0, 53*sec, 53*sec, 53*sec)}},
		{At: 7 * sec, Hits: []algo.Hit{h("c", c, 1)}, Want: []algo.Decision{OK(0, 60*sec, 60*sec)}},
	}}
}

// fractional: a client retrying every 10 ms against 1 per second, for 3 s.
// Fixed window, token bucket, sliding log and a 1-lease concurrency limit
// admit exactly at 0, 1 and 2 s; every denial gives the exact wait. The
// sliding window counter at Rate 1 admits every 2 s: the previous window's
// single admission keeps a weight above 0 until its window's end.
func fractional() []Table {
	var out []Table
	for _, k := range []algo.Kind{algo.FixedWindow, algo.TokenBucket, algo.SlidingLog, algo.Concurrency, algo.SlidingWindow} {
		l := algo.Limit{Kind: k, Rate: 1, Period: sec}
		cycle := sec
		if k == algo.SlidingWindow {
			cycle = 2 * sec
		}
		var steps []Step
		for at := time.Duration(0); at < 3*sec; at += 10 * ms {
			c := at % cycle
			want := OK(0, cycle, cycle)
			if c != 0 {
				w := cycle - c
				want = Deny(0, w, w, w)
			}
			steps = append(steps, one(at, "k", l, 1, want))
		}
		out = append(out, Table{Name: "fractional_refill_" + KindName(k), Steps: steps})
	}
	return out
}

// KindName is the configuration name of k (the algorithm: field of a
// rule: fixed_window, sliding_window, sliding_log, token_bucket,
// concurrency), for test and subtest names.
func KindName(k algo.Kind) string {
	switch k {
	case algo.FixedWindow:
		return "fixed_window"
	case algo.SlidingWindow:
		return "sliding_window"
	case algo.SlidingLog:
		return "sliding_log"
	case algo.TokenBucket:
		return "token_bucket"
	default:
		return "concurrency"
	}
}

// chg is a single-hit step under the always_charge counting policy.
func chg(at time.Duration, key string, l algo.Limit, cost int64, want algo.Decision) Step {
	s := one(at, key, l, cost, want)
	s.Hits[0].Charge = true
	return s
}

// refunds: releases (Envoy's is_negative_hits) on every algorithm; each is
// allowed and reports a check on the credited state.
func refunds() Table {
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Minute}
	sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 10, Period: time.Minute}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 1, Period: sec, Burst: 3}
	sl := algo.Limit{Kind: algo.SlidingLog, Rate: 3, Period: 10 * sec}
	return Table{Name: "refund", Steps: []Step{
		// fixed window: 100 per minute, 90 remaining, a refund of 5 leaves 95
		one(0, "f", fw, 10, OK(90, 60*sec, 60*sec)),
		rel(sec, "f", fw, 5, OK(95, 59*sec, 59*sec)),
		rel(sec, "f", fw, 200, OK(100, 59*sec, 59*sec)), // floored at 0
		one(2*sec, "f", fw, 100, OK(0, 58*sec, 58*sec)),
		one(2*sec, "f", fw, 1, Deny(0, 58*sec, 58*sec, 58*sec)),
		rel(2*sec, "f", fw, 1, OK(1, 58*sec, 58*sec)),
		one(2*sec, "f", fw, 1, OK(0, 58*sec, 58*sec)),
		rel(61*sec, "f", fw, 5, OK(100, 59*sec, 59*sec)), // the window reset: nothing to refund
		// sliding window: the current window's count first, then the previous one's
		one(30*sec, "w", sw, 10, OK(0, 90*sec, 36*sec)),
		// at 60 s: curr 0, prev 10 - 4 = 6 (weight 1): est 6; 5 more once 5*60/6 = 50 s before 120 s
		rel(60*sec, "w", sw, 4, OK(4, 60*sec, 10*sec)),
		one(60*sec, "w", sw, 4, OK(0, 120*sec, 10*sec)),
		rel(60*sec, "w", sw, 20, OK(10, 60*sec, 60*sec)), // curr 4 -> 0, prev 6 -> 0
		// token bucket (T = 1 s, capacity 3): the TAT moves back, never before now
		one(0, "t", tb, 3, OK(0, 3*sec, sec)),
		rel(0, "t", tb, 2, OK(2, sec, sec)), // TAT 3 s -> 1 s
		rel(500*ms, "t", tb, 5, OK(3, 0, sec)),
		one(500*ms, "t", tb, 1, OK(2, sec, sec)),
		// sliding log: the newest entries go
		one(0, "l", sl, 1, OK(2, 10*sec, 10*sec)),
		one(sec, "l", sl, 1, OK(1, 10*sec, 9*sec)),
		one(2*sec, "l", sl, 1, OK(0, 10*sec, 8*sec)),
		rel(3*sec, "l", sl, 1, OK(1, 8*sec, 7*sec)), // the entry at 2 s goes
		one(3*sec, "l", sl, 2, Deny(1, 7*sec, 8*sec, 7*sec)),
		rel(3*sec, "l", sl, 9, OK(3, 0, 10*sec)),
	}}
}

// alwaysCharge: a denied take under always_charge is charged, and the
// state it reports is the one after the charge.
func alwaysCharge() Table {
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Minute}
	sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 10, Period: time.Minute}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 1, Period: sec, Burst: 3}
	sl := algo.Limit{Kind: algo.SlidingLog, Rate: 2, Period: 10 * sec}
	cc := algo.Limit{Kind: algo.Concurrency, Rate: 2, Period: 30 * sec}
	return Table{Name: "always_charge", Steps: []Step{
		chg(0, "f", fw, 2, OK(1, 60*sec, 60*sec)),
		chg(sec, "f", fw, 5, Deny(0, 59*sec, 59*sec, 59*sec)), // count 7
		one(sec, "f", fw, 0, Deny(0, 59*sec, 59*sec, 59*sec)),
		rel(sec, "f", fw, 5, OK(1, 59*sec, 59*sec)), // 7 - 5 = 2: the overshoot stayed counted
		chg(60*sec, "f", fw, 1, OK(2, 60*sec, 60*sec)),
		// sliding window: 15 at 30 s (curr 15); 1 more once 15*w <= 9 in the next window: w = 0.6 at 84 s
		chg(30*sec, "w", sw, 15, Deny(0, 30*sec, 90*sec, 54*sec)),
		// the overshoot carries into the next window: 9 = 10-1 once 15*(120-t)/60 <= 9, t = 84 s
		one(60*sec, "w", sw, 1, Deny(0, 24*sec, 60*sec, 24*sec)),
		// token bucket (T = 1 s, capacity 3): 5 from full is 2 tokens of debt (TAT 5 s)
		chg(0, "t", tb, 5, Deny(0, sec, 5*sec, 3*sec)),
		chg(0, "t", tb, 5, Deny(0, sec, 6*sec, 4*sec)), // at most one capacity of debt: TAT 6 s
		one(4*sec, "t", tb, 1, OK(0, 3*sec, sec)),
		// sliding log: at most 2*Rate entries
		chg(0, "l", sl, 3, Deny(0, 10*sec, 10*sec, 10*sec)),  // 3 entries at 0 s
		chg(sec, "l", sl, 5, Deny(0, 10*sec, 10*sec, 9*sec)), // one more, at 1 s
		one(10*sec, "l", sl, 1, OK(0, 10*sec, sec)),          // only the entry at 1 s is live
		chg(0, "c", cc, 3, Deny(2, 30*sec, 0, 30*sec)),       // a lease is never charged
		one(0, "c", cc, 0, OK(2, 0, 30*sec)),
	}}
}

// alwaysChargeMultiHit: under always_charge every hit of a denied request
// is charged; an all_or_nothing hit of the same request is rolled back;
// a release is kept; a concurrency lease is not (Charge does not apply).
func alwaysChargeMultiHit() Table {
	a := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}
	b := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Minute}
	cc := algo.Limit{Kind: algo.Concurrency, Rate: 1, Period: time.Minute}
	h := func(key string, l algo.Limit, cost int64) algo.Hit { return algo.Hit{Key: key, Limit: l, Cost: cost} }
	c := func(x algo.Hit) algo.Hit { x.Charge = true; return x }
	r := func(x algo.Hit) algo.Hit { x.Release = true; return x }
	return Table{Name: "always_charge_multi_hit", Steps: []Step{
		{At: 0, Hits: []algo.Hit{c(h("a", a, 1)), c(h("b", b, 1))}, Want: []algo.Decision{OK(4, 60*sec, 60*sec), OK(0, 60*sec, 60*sec)}},
		// b denies and is charged; a is charged too and reports the state after its hit
		{At: sec, Hits: []algo.Hit{c(h("a", a, 1)), c(h("b", b, 1))}, Want: []algo.Decision{OK(3, 59*sec, 59*sec), Deny(0, 59*sec, 59*sec, 59*sec)}},
		{At: sec, Hits: []algo.Hit{h("a", a, 0)}, Want: []algo.Decision{OK(3, 59*sec, 59*sec)}},
		// all_or_nothing a with always_charge b: a is rolled back
		{At: 2 * sec, Hits: []algo.Hit{h("a", a, 1), c(h("b", b, 1))}, Want: []algo.Decision{OK(3, 58*sec, 58*sec), Deny(0, 58*sec, 58*sec, 58*sec)}},
		{At: 2 * sec, Hits: []algo.Hit{h("a", a, 0)}, Want: []algo.Decision{OK(3, 58*sec, 58*sec)}},
		// a release in a denied request is kept
		{At: 3 * sec, Hits: []algo.Hit{r(h("a", a, 2)), h("b", b, 1)}, Want: []algo.Decision{OK(5, 57*sec, 57*sec), Deny(0, 57*sec, 57*sec, 57*sec)}},
		{At: 3 * sec, Hits: []algo.Hit{h("a", a, 0)}, Want: []algo.Decision{OK(5, 57*sec, 57*sec)}},
		// a concurrency lease is never kept by always_charge: rolled back with its denied request
		{At: 4 * sec, Hits: []algo.Hit{c(h("l", cc, 1)), h("b", b, 1)}, Want: []algo.Decision{OK(1, 0, 60*sec), Deny(0, 56*sec, 56*sec, 56*sec)}},
		{At: 4 * sec, Hits: []algo.Hit{h("l", cc, 0)}, Want: []algo.Decision{OK(1, 0, 60*sec)}},
	}}
}
