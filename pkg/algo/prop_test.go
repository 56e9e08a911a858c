package algo_test

import (
	"math"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()

type event struct {
	t       int64 // µs
	cost    int64
	release bool
	allowed bool
}

// drawLimit draws a limit of kind k: Rate 1 to 12 per Period of 1 µs to
// 3 s, and for TokenBucket a Burst of 0 to 20. It returns the limit, its
// capacity (Burst when set, else Rate) and its Period in microseconds.
func drawLimit(rt *rapid.T, k algo.Kind) (l algo.Limit, capa, periodMicros int64) {
	l = algo.Limit{
		Kind:   k,
		Rate:   rapid.Int64Range(1, 12).Draw(rt, "rate"),
		Period: time.Duration(rapid.Int64Range(1, 3_000_000).Draw(rt, "period_us")) * time.Microsecond,
	}
	if k == algo.TokenBucket {
		l.Burst = rapid.Int64Range(0, 20).Draw(rt, "burst")
	}
	capa = l.Rate
	if l.Burst > 0 {
		capa = l.Burst
	}
	return l, capa, l.Period.Microseconds()
}

// schedule draws a limit of kind k and a non-decreasing schedule of hits
// (several at the same instant allowed), applies it, and checks the
// properties every algorithm shares: Remaining >= 0; a hit is allowed iff
// max(cost, 1) <= the Remaining a check reports just before it; a denied
// hit and a check leave the state unchanged; RetryAfter > 0 iff denied.
func schedule(rt *rapid.T, k algo.Kind) (algo.Limit, []event) {
	l, capa, p := drawLimit(rt, k)
	n := rapid.IntRange(1, 150).Draw(rt, "n")
	var st algo.State
	t := base + rapid.Int64Range(0, p).Draw(rt, "start")
	events := make([]event, 0, n)
	for i := range n {
		switch rapid.IntRange(0, 3).Draw(rt, "gapkind") {
		case 0: // same instant
		case 1:
			t += rapid.Int64Range(1, max(p/20, 1)).Draw(rt, "small")
		case 2:
			t += rapid.Int64Range(1, p).Draw(rt, "medium")
		default:
			t += rapid.Int64Range(1, 3*p).Draw(rt, "large")
		}
		e := event{t: t, cost: rapid.Int64Range(0, capa+1).Draw(rt, "cost")}
		if k == algo.Concurrency {
			e.release = rapid.IntRange(0, 3).Draw(rt, "release") == 0
		}
		now := time.UnixMicro(t)
		_, check := algo.Take(l, st, now, 0)
		// The clock going backwards never admits extra: the same state is
		// never more permissive at an earlier instant.
		back := time.UnixMicro(t - rapid.Int64Range(1, 3*p).Draw(rt, "back"))
		if _, bd := algo.Take(l, st, back, e.cost); bd.Allowed && !e.release {
			if _, nd := algo.Take(l, st, now, e.cost); !nd.Allowed {
				rt.Fatalf("event %d: cost %d allowed at %d but denied at %d", i, e.cost, back.UnixMicro(), t)
			}
		}
		if _, bc := algo.Take(l, st, back, 0); bc.Remaining > check.Remaining {
			rt.Fatalf("event %d: remaining %d at %d > %d at %d", i, bc.Remaining, back.UnixMicro(), check.Remaining, t)
		}
		prev := st
		var d algo.Decision
		st, d = algo.Apply(st, algo.Hit{Limit: l, Cost: e.cost, Release: e.release}, now)
		if d.Remaining < 0 || check.Remaining < 0 {
			rt.Fatalf("event %d: negative remaining %+v %+v", i, d, check)
		}
		if !e.release && d.Allowed != (max(e.cost, 1) <= check.Remaining) {
			rt.Fatalf("event %d cost %d: allowed %v but check says remaining %d", i, e.cost, d.Allowed, check.Remaining)
		}
		if (!d.Allowed || (e.cost == 0 && !e.release)) && !reflect.DeepEqual(prev, st) {
			rt.Fatalf("event %d: denied or check changed the state %+v -> %+v", i, prev, st)
		}
		if d.Allowed != (d.RetryAfter == 0) || d.RetryAfter < 0 {
			rt.Fatalf("event %d: allowed %v with RetryAfter %v", i, d.Allowed, d.RetryAfter)
		}
		if d.Allowed && !e.release && d.Remaining != check.Remaining-e.cost {
			rt.Fatalf("event %d: remaining %d after cost %d, before %d", i, d.Remaining, e.cost, check.Remaining)
		}
		e.allowed = d.Allowed
		events = append(events, e)
	}
	return l, events
}

// admitted sums the admitted cost of events with time in (lo, hi].
func admitted(events []event, lo, hi int64) int64 {
	var s int64
	for _, e := range events {
		if e.allowed && !e.release && e.t > lo && e.t <= hi {
			s += e.cost
		}
	}
	return s
}

func TestPropTokenBucket(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l, ev := schedule(rt, algo.TokenBucket)
		capa := max(l.Burst, 0)
		if capa == 0 {
			capa = l.Rate
		}
		p := l.Period.Microseconds()
		// any interval [ti, tj]: admitted <= capacity + Rate*(tj-ti)/P
		for i := range ev {
			for j := i; j < len(ev); j++ {
				sum := admitted(ev, ev[i].t-1, ev[j].t)
				if sum*p > capa*p+l.Rate*(ev[j].t-ev[i].t) {
					rt.Fatalf("%d admitted in [%d, %d] µs > %d + %d*%d/%d", sum, ev[i].t, ev[j].t, capa, l.Rate, ev[j].t-ev[i].t, p)
				}
			}
		}
	})
}

func TestPropFixedWindow(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l, ev := schedule(rt, algo.FixedWindow)
		per := map[int64]int64{}
		for _, e := range ev {
			if e.allowed {
				ws, _ := algo.WindowBoundsUs(l, e.t)
				per[ws] += e.cost
				if per[ws] > l.Rate {
					rt.Fatalf("window %d admitted %d > %d", ws, per[ws], l.Rate)
				}
			}
		}
	})
}

func TestPropSlidingLog(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l, ev := schedule(rt, algo.SlidingLog)
		p := l.Period.Microseconds()
		for _, e := range ev {
			if s := admitted(ev, e.t-p, e.t); s > l.Rate {
				rt.Fatalf("%d admitted in (%d, %d] > %d", s, e.t-p, e.t, l.Rate)
			}
		}
	})
}

func TestPropSlidingWindow(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l, ev := schedule(rt, algo.SlidingWindow)
		p := l.Period.Microseconds()
		for _, e := range ev {
			if s := admitted(ev, e.t-p, e.t); s > 2*l.Rate {
				rt.Fatalf("%d admitted in (%d, %d] > 2*%d", s, e.t-p, e.t, l.Rate)
			}
		}
	})
}

func TestPropConcurrency(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l, ev := schedule(rt, algo.Concurrency)
		p := l.Period.Microseconds()
		var leases []int64 // model: acquisition times, oldest first
		for i, e := range ev {
			kept := leases[:0]
			for _, x := range leases {
				if x+p > e.t {
					kept = append(kept, x)
				}
			}
			leases = kept
			switch {
			case e.release:
				leases = leases[min(int(e.cost), len(leases)):]
			case e.allowed:
				for range e.cost {
					leases = append(leases, e.t)
				}
			}
			if int64(len(leases)) > l.Rate {
				rt.Fatalf("event %d: %d live leases > %d", i, len(leases), l.Rate)
			}
			if !e.release && !e.allowed && int64(len(leases))+max(e.cost, 1) <= l.Rate {
				rt.Fatalf("event %d: denied cost %d with %d of %d leases live", i, e.cost, len(leases), l.Rate)
			}
		}
	})
}

// FuzzTake: any valid limit, state produced by the algorithm and instant:
// no panic, Remaining within [0, capacity], durations non-negative.
func FuzzTake(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(60_000_000), int64(0), uint8(0), int64(1), int64(0), int64(5), int64(1))
	f.Add(uint8(3), int64(3), int64(1_000_000), int64(7), uint8(0), int64(1), int64(-5_000_000), int64(2), int64(4))
	f.Add(uint8(1), int64(2), int64(86_400_000_000), int64(0), uint8(1), int64(3), int64(40*86_400_000_000), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, kind uint8, rate, periodUs, burst int64, cal uint8, mult, offUs, cost1, cost2 int64) {
		l := algo.Limit{Kind: algo.Kind(kind % 5), Rate: rate, Period: time.Duration(periodUs) * time.Microsecond,
			Burst: burst, Calendar: algo.Calendar(cal % 3), Multiplier: mult}
		if periodUs <= 0 || periodUs > int64(algo.MaxPeriod/time.Microsecond) || l.Validate() != nil {
			return
		}
		off := offUs % (1 << 50) // within about ±35 years of base
		capa := l.Rate
		if l.Kind == algo.TokenBucket && l.Burst > 0 {
			capa = l.Burst
		}
		var st algo.State
		for i, c := range []int64{cost1, cost2, cost1, 0} {
			now := time.UnixMicro(base + off + int64(i)*periodUs/3)
			var d algo.Decision
			st, d = algo.Apply(st, algo.Hit{Limit: l, Cost: c, Release: c < 0}, now)
			if d.Remaining < 0 || d.Remaining > capa || d.RetryAfter < 0 || d.ResetAfter < 0 || d.WindowAfter < 0 {
				t.Fatalf("%+v cost %d at %v: %+v", l, c, now, d)
			}
			if d.Allowed == (d.RetryAfter > 0) {
				t.Fatalf("%+v: allowed %v with retry %v", l, d.Allowed, d.RetryAfter)
			}
		}
	})
}

// maxCostLimit draws a valid limit of kind k anywhere in Validate's range,
// extremes included (capacities up to 2^53-1, periods down to 1 µs), and
// returns it with its capacity.
func maxCostLimit(rt *rapid.T, k algo.Kind) (algo.Limit, int64) {
	p := rapid.OneOf(rapid.Int64Range(1, 10), rapid.Int64Range(1, 3_600_000_000), rapid.Just(int64(algo.MaxPeriod/time.Microsecond))).Draw(rt, "period_us")
	l := algo.Limit{Kind: k, Period: time.Duration(p) * time.Microsecond}
	huge := rapid.OneOf(rapid.Int64Range(1, 12), rapid.Int64Range(1, algo.MaxExact-1), rapid.Just(algo.MaxExact-1))
	switch k {
	case algo.SlidingLog:
		l.Rate = rapid.OneOf(rapid.Int64Range(1, 12), rapid.Just(int64(algo.MaxSlidingLogRate))).Draw(rt, "rate")
	case algo.Concurrency:
		l.Rate = rapid.OneOf(rapid.Int64Range(1, 12), rapid.Just(int64(algo.MaxConcurrencyRate))).Draw(rt, "rate")
	case algo.TokenBucket:
		cmax := min(algo.MaxExact/p, algo.MaxCost-1)
		l.Rate = min(huge.Draw(rt, "rate"), cmax)
		cmax = min(cmax, algo.MaxExact/l.Rate)
		l.Rate = min(l.Rate, cmax)
		l.Burst = rapid.OneOf(rapid.Just(int64(0)), rapid.Int64Range(1, cmax), rapid.Just(cmax)).Draw(rt, "burst")
	default:
		l.Rate = huge.Draw(rt, "rate")
		if k == algo.FixedWindow || k == algo.SlidingWindow {
			if c := rapid.IntRange(0, 2).Draw(rt, "calendar"); c > 0 {
				l.Calendar = algo.Calendar(c)
				l.Multiplier = rapid.Int64Range(1, 12).Draw(rt, "multiplier")
			}
		}
	}
	if err := l.Validate(); err != nil {
		rt.Fatalf("test drew an invalid limit %+v: %v", l, err)
	}
	capa := l.Rate
	if l.Burst > 0 {
		capa = l.Burst
	}
	return l, capa
}

// TestPropMaxCost: for every algorithm and every valid limit, a take of
// algo.MaxCost (the clamp of any hits_addend) is denied as above capacity,
// leaves the state as it was and gives sane durations; a larger cost
// (up to 2^63-1) decides exactly like MaxCost; a take of the whole capacity
// on an empty state still passes (the capacity is below MaxCost and
// nothing overflows); a Concurrency release of MaxCost returns every
// live lease; a refund of MaxCost empties every kind; and a charge of
// MaxCost (always_charge) is denied with Remaining 0, twice in a row.
func TestPropMaxCost(t *testing.T) {
	if algo.ClampCost(-1) != 0 || algo.ClampCost(math.MaxInt64) != algo.MaxCost || algo.ClampCost(7) != 7 {
		t.Fatal("ClampCost")
	}
	if float64(algo.MaxCost) != 9007199254740992 || int64(float64(algo.MaxCost)) != algo.MaxCost {
		t.Fatal("MaxCost is not 2^53")
	}
	rapid.Check(t, func(rt *rapid.T) {
		k := algo.Kind(rapid.IntRange(0, int(algo.Concurrency)).Draw(rt, "kind"))
		l, capa := maxCostLimit(rt, k)
		p := l.Period.Microseconds()
		t0 := base + rapid.Int64Range(0, 1<<40).Draw(rt, "start")
		if (k != algo.SlidingLog && k != algo.Concurrency) || capa <= 1000 {
			if _, d := algo.Take(l, algo.State{}, time.UnixMicro(t0), capa); !d.Allowed || d.Remaining != 0 {
				rt.Fatalf("%+v: a take of the whole capacity %d on an empty state: %+v", l, capa, d)
			}
		}
		// A state the algorithm produced: a few takes at increasing instants.
		var st algo.State
		tt := t0
		for range rapid.IntRange(0, 6).Draw(rt, "takes") {
			tt += rapid.Int64Range(0, max(p/3, 1)).Draw(rt, "gap")
			c := rapid.Int64Range(0, min(capa, 50)).Draw(rt, "cost")
			st, _ = algo.Take(l, st, time.UnixMicro(tt), c)
		}
		now := time.UnixMicro(tt + rapid.Int64Range(0, max(p/3, 1)).Draw(rt, "at"))
		ns, d := algo.Take(l, st, now, algo.MaxCost)
		if d.Allowed || d.RetryAfter <= 0 || d.ResetAfter < 0 || d.WindowAfter < 0 || d.Remaining < 0 || d.Remaining > capa {
			rt.Fatalf("%+v: take of MaxCost: %+v", l, d)
		}
		if !reflect.DeepEqual(ns, st) {
			rt.Fatalf("%+v: take of MaxCost changed the state %+v -> %+v", l, st, ns)
		}
		for _, c := range []int64{algo.MaxCost + 1, math.MaxInt64} {
			if bs, bd := algo.Take(l, st, now, c); bd != d || !reflect.DeepEqual(bs, st) {
				rt.Fatalf("%+v: cost %d decided %+v, MaxCost %+v", l, c, bd, d)
			}
		}
		if k == algo.Concurrency {
			rs, rd := algo.Release(l, st, now, algo.MaxCost)
			if !rd.Allowed || rd.Remaining != l.Rate || len(rs.Log) != 0 {
				rt.Fatalf("%+v: release of MaxCost: %+v, state %+v", l, rd, rs)
			}
		}
		// A refund of MaxCost empties every kind; a charge of MaxCost is
		// denied, charged (Remaining 0; Concurrency: Take) and sane.
		if rs, rd := algo.Release(l, st, now, algo.MaxCost); !rd.Allowed || rd.RetryAfter != 0 || rd.Remaining != capa {
			rt.Fatalf("%+v: refund of MaxCost: %+v, state %+v", l, rd, rs)
		}
		cs, cd := algo.Charge(l, st, now, algo.MaxCost)
		if cd.Allowed || cd.RetryAfter <= 0 || cd.ResetAfter < 0 || cd.WindowAfter < 0 || (k != algo.Concurrency && cd.Remaining != 0) {
			rt.Fatalf("%+v: charge of MaxCost: %+v", l, cd)
		}
		if k == algo.Concurrency && (cd != d || !reflect.DeepEqual(cs, st)) {
			rt.Fatalf("%+v: a concurrency charge differs from a take: %+v, %+v", l, cd, d)
		}
		if _, again := algo.Charge(l, cs, now, algo.MaxCost); again.Allowed || again.Remaining < 0 {
			rt.Fatalf("%+v: a second charge of MaxCost: %+v", l, again)
		}
	})
}

// TestPropChargeAndRefund: for every algorithm, random schedules of takes,
// always_charge takes and releases (refunds). Charge equals Take when Take
// allows or the cost is 0; a denied charge of cost > 0 reports Remaining 0
// (the state after the charge) and a check right after it is denied too,
// except for Concurrency, where Charge is Take. A release is always
// allowed with RetryAfter 0, never lowers what a check reports, and
// reports that check's Remaining; outside Concurrency a release of what
// an allowed take just took, at the same instant, restores the check
// before the take exactly.
func TestPropChargeAndRefund(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		k := algo.Kind(rapid.IntRange(0, int(algo.Concurrency)).Draw(rt, "kind"))
		l, capa, p := drawLimit(rt, k)
		var st algo.State
		tt := base + rapid.Int64Range(0, p).Draw(rt, "start")
		for i := range rapid.IntRange(1, 100).Draw(rt, "n") {
			tt += rapid.Int64Range(0, p).Draw(rt, "gap")
			now := time.UnixMicro(tt)
			cost := rapid.Int64Range(0, 3*capa).Draw(rt, "cost")
			_, check := algo.Take(l, st, now, 0)
			switch rapid.IntRange(0, 2).Draw(rt, "op") {
			case 0: // take, then maybe refund it at once
				ns, d := algo.Take(l, st, now, cost)
				if d.Allowed && cost > 0 && k != algo.Concurrency {
					rs, rd := algo.Release(l, ns, now, cost)
					if _, c2 := algo.Take(l, rs, now, 0); c2 != check || rd.Remaining != check.Remaining {
						rt.Fatalf("step %d: take %d then refund: check %+v (refund %+v), before the take %+v", i, cost, c2, rd, check)
					}
				}
				st = ns
			case 1: // always_charge
				ts, td := algo.Take(l, st, now, cost)
				ns, d := algo.Charge(l, st, now, cost)
				if td.Allowed || cost == 0 || k == algo.Concurrency {
					if d != td || !reflect.DeepEqual(ns, ts) {
						rt.Fatalf("step %d: charge %d = %+v, take %+v", i, cost, d, td)
					}
				} else {
					_, after := algo.Take(l, ns, now, 0)
					if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || after.Allowed || after.Remaining != 0 {
						rt.Fatalf("step %d: denied charge %d: %+v, then a check %+v", i, cost, d, after)
					}
				}
				st = ns
			default: // refund
				ns, d := algo.Release(l, st, now, cost)
				_, after := algo.Take(l, ns, now, 0)
				if !d.Allowed || d.RetryAfter != 0 || d.Remaining < check.Remaining || d.Remaining != after.Remaining || d.Remaining > capa {
					rt.Fatalf("step %d: refund %d: %+v; check before %+v, after %+v", i, cost, d, check, after)
				}
				st = ns
			}
		}
	})
}
