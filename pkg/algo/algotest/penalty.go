package algotest

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// penaltyTables are the penalty box's tables (algo.Hit.Penalty): the
// After-th denial within Within starts a block of Block, every hit in it
// is denied until the block's end (later with Extend), the count starts
// again after a block, denials outside Within do not count, Soft hits
// never count or block, releases pass a block, and a denied request
// keeps its penalized hits' counts (a Soft hit's none) while its other
// hits roll back.
func penaltyTables() []Table {
	// 2 per 10 s windows; 3 denials within 1 min block for 30 s
	fixed := algo.Limit{Kind: algo.FixedWindow, Rate: 2, Period: 10 * sec}
	box := algo.Penalty{After: 3, Within: time.Minute, Block: 30 * sec}
	ext := box
	ext.Extend = true
	short := box
	short.Within = 5 * sec
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 1, Period: sec, Burst: 1}
	two := algo.Penalty{After: 2, Within: time.Minute, Block: 20 * sec}
	big := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}

	hit := func(key string, l algo.Limit, p algo.Penalty) algo.Hit {
		return algo.Hit{Key: key, Limit: l, Cost: 1, Penalty: p}
	}
	step := func(at time.Duration, h algo.Hit, want algo.Decision) Step {
		return Step{At: at, Hits: []algo.Hit{h}, Want: []algo.Decision{want}}
	}
	started := func(w time.Duration) algo.Decision {
		d := Deny(0, w, w, w)
		d.Penalty = algo.PenaltyStarted
		return d
	}
	blocked := func(w time.Duration) algo.Decision {
		d := Deny(0, w, w, w)
		d.Penalty = algo.PenaltyBlocked
		return d
	}
	soft := func(h algo.Hit) algo.Hit { h.Soft = true; return h }
	release := func(h algo.Hit) algo.Hit { h.Release = true; return h }
	charge := func(h algo.Hit) algo.Hit { h.Charge = true; return h }
	check := func(h algo.Hit) algo.Hit { h.Cost = 0; return h }

	k := hit("k", fixed, box)
	return []Table{
		{Name: "penalty_box", Steps: []Step{
			step(0, k, OK(1, 10*sec, 10*sec)),
			step(1*sec, k, OK(0, 9*sec, 9*sec)),
			step(2*sec, k, Deny(0, 8*sec, 8*sec, 8*sec)),    // denial 1
			step(3*sec, k, Deny(0, 7*sec, 7*sec, 7*sec)),    // denial 2
			step(4*sec, k, started(30*sec)),                 // denial 3: blocked until 34 s
			step(10*sec, k, blocked(24*sec)),                // the limit would admit: the block holds
			step(10*sec, check(k), blocked(24*sec)),         // a check is blocked too
			step(20*sec, release(k), OK(2, 10*sec, 10*sec)), // a release passes (nothing to return)
			step(33*sec, k, blocked(1*sec)),                 // no extension without extend
			step(34*sec, k, OK(1, 6*sec, 6*sec)),            // the block ended: the limit applies again
			step(35*sec, k, OK(0, 5*sec, 5*sec)),
			step(36*sec, k, Deny(0, 4*sec, 4*sec, 4*sec)), // the count started again: denial 1
			step(37*sec, k, Deny(0, 3*sec, 3*sec, 3*sec)), // denial 2
			step(38*sec, k, started(30*sec)),              // denial 3: blocked until 68 s
			step(67*sec, k, blocked(1*sec)),
			step(68*sec, k, OK(1, 2*sec, 2*sec)),
		}},
		{Name: "penalty_box_extend", Steps: []Step{
			step(0, hit("k", fixed, ext), OK(1, 10*sec, 10*sec)),
			step(0, hit("k", fixed, ext), OK(0, 10*sec, 10*sec)),
			step(1*sec, hit("k", fixed, ext), Deny(0, 9*sec, 9*sec, 9*sec)),
			step(2*sec, hit("k", fixed, ext), Deny(0, 8*sec, 8*sec, 8*sec)),
			step(3*sec, hit("k", fixed, ext), started(30*sec)),  // until 33 s
			step(20*sec, hit("k", fixed, ext), blocked(30*sec)), // extended: until 50 s
			step(49*sec, hit("k", fixed, ext), blocked(30*sec)), // until 79 s
			step(79*sec, hit("k", fixed, ext), OK(1, 1*sec, 1*sec)),
		}},
		{Name: "penalty_box_within", Steps: []Step{
			step(0, hit("k", fixed, short), OK(1, 10*sec, 10*sec)),
			step(0, hit("k", fixed, short), OK(0, 10*sec, 10*sec)),
			step(2*sec, hit("k", fixed, short), Deny(0, 8*sec, 8*sec, 8*sec)), // denial 1, window until 7 s
			step(3*sec, hit("k", fixed, short), Deny(0, 7*sec, 7*sec, 7*sec)), // denial 2
			step(7*sec, hit("k", fixed, short), Deny(0, 3*sec, 3*sec, 3*sec)), // window over: denial 1 again
			step(8*sec, hit("k", fixed, short), Deny(0, 2*sec, 2*sec, 2*sec)), // denial 2
			step(9*sec, hit("k", fixed, short), started(30*sec)),
		}},
		{Name: "penalty_box_soft", Steps: []Step{
			// shadow and quota mode (Soft) never count a denial or block
			step(0, soft(k), OK(1, 10*sec, 10*sec)),
			step(0, soft(k), OK(0, 10*sec, 10*sec)),
			step(1*sec, soft(k), Deny(0, 9*sec, 9*sec, 9*sec)),
			step(2*sec, soft(k), Deny(0, 8*sec, 8*sec, 8*sec)),
			step(3*sec, soft(k), Deny(0, 7*sec, 7*sec, 7*sec)),
			step(4*sec, soft(k), Deny(0, 6*sec, 6*sec, 6*sec)),
			step(10*sec, soft(k), OK(1, 10*sec, 10*sec)),
		}},
		{Name: "penalty_box_token_bucket", Steps: []Step{
			step(0, hit("t", tb, two), OK(0, sec, sec)),
			step(100*ms, hit("t", tb, two), Deny(0, 900*ms, 900*ms, 900*ms)),
			step(200*ms, hit("t", tb, two), started(20*sec)), // until 20.2 s
			step(5*sec, hit("t", tb, two), blocked(15200*ms)),
			step(20200*ms, hit("t", tb, two), OK(0, sec, sec)),
		}},
		{Name: "penalty_box_multi_hit", Steps: []Step{
			// "p" penalized (1 per 10 s... rate 2), "b" plain: a denial of p
			// rolls b back but p's count is kept
			{At: 0, Hits: []algo.Hit{hit("p", fixed, two), {Key: "b", Limit: big, Cost: 1}},
				Want: []algo.Decision{OK(1, 10*sec, 10*sec), OK(4, 60*sec, 60*sec)}},
			{At: 0, Hits: []algo.Hit{hit("p", fixed, two), {Key: "b", Limit: big, Cost: 1}},
				Want: []algo.Decision{OK(0, 10*sec, 10*sec), OK(3, 60*sec, 60*sec)}},
			{At: 1 * sec, Hits: []algo.Hit{{Key: "b", Limit: big, Cost: 1}, hit("p", fixed, two)},
				Want: []algo.Decision{OK(3, 59*sec, 59*sec), Deny(0, 9*sec, 9*sec, 9*sec)}}, // b rolled back
			{At: 2 * sec, Hits: []algo.Hit{{Key: "b", Limit: big, Cost: 1}, hit("p", fixed, two)},
				Want: []algo.Decision{OK(3, 58*sec, 58*sec), started(20 * sec)}}, // p's count was kept
			{At: 12 * sec, Hits: []algo.Hit{hit("p", fixed, two), {Key: "b", Limit: big, Cost: 1}},
				Want: []algo.Decision{blocked(10 * sec), OK(3, 48*sec, 48*sec)}},
			// a charged (always_charge) hit is not charged by a block
			{At: 13 * sec, Hits: []algo.Hit{charge(hit("p", fixed, two))},
				Want: []algo.Decision{blocked(9 * sec)}},
			{At: 22 * sec, Hits: []algo.Hit{charge(hit("p", fixed, two)), {Key: "b", Limit: big, Cost: 1}},
				Want: []algo.Decision{OK(1, 8*sec, 8*sec), OK(2, 38*sec, 38*sec)}},
		}},
		{Name: "penalty_box_soft_rollback", Steps: []Step{
			// a denied request keeps the counts of its penalized hits only:
			// the always_charge check's denial that denied the request is
			// replayed (and admitted) on the state before it, and the
			// later Soft hit on the same key keeps no count either
			step(0, hit("k", fixed, two), OK(1, 10*sec, 10*sec)),
			{At: 1 * sec, Hits: []algo.Hit{hit("k", fixed, two), charge(check(hit("k", fixed, two))), soft(hit("k", fixed, two))},
				Want: []algo.Decision{OK(1, 9*sec, 9*sec), OK(1, 9*sec, 9*sec), Deny(0, 9*sec, 9*sec, 9*sec)}},
			step(2*sec, hit("k", fixed, two), OK(0, 8*sec, 8*sec)),
			step(3*sec, hit("k", fixed, two), Deny(0, 7*sec, 7*sec, 7*sec)), // denial 1
			step(4*sec, hit("k", fixed, two), started(20*sec)),              // denial 2
		}},
	}
}
