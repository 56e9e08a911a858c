package algo_test

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Leases taken in any order by any number of subscribers, with returns,
// never grant more than the limit admits: the units granted in a fixed
// window sum to at most Rate, and every grant is what one allowed take of
// that many units is.
func TestLeaseNeverAboveLimit(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		k := rapid.SampledFrom([]algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.TokenBucket}).Draw(rt, "kind")
		l, capa, p := drawLimit(rt, k)
		var st algo.State
		tm := base + rapid.Int64Range(0, p).Draw(rt, "start")
		held := map[int64]int64{} // fixed window: units held per window start
		for range rapid.IntRange(1, 60).Draw(rt, "ops") {
			tm += rapid.Int64Range(0, max(p/5, 1)).Draw(rt, "gap")
			now := time.UnixMicro(tm)
			want := rapid.Int64Range(-2, 2*capa).Draw(rt, "want")
			_, chk := algo.Take(l, st, now, 0)
			next, g, d := algo.Lease(l, st, now, want, 0)
			if g < 0 || g > max(want, 0) || g > chk.Remaining {
				rt.Fatalf("granted %d of want %d with %d remaining", g, want, chk.Remaining)
			}
			if g > 0 {
				ref, rd := algo.Take(l, st, now, g)
				if !rd.Allowed || ref.Time != next.Time || ref.Count != next.Count || ref.Prev != next.Prev || rd.Remaining != d.Remaining {
					rt.Fatalf("lease of %d is not a take of %d: %+v %+v vs %+v %+v", g, g, next, d, ref, rd)
				}
			}
			st = next
			if k == algo.FixedWindow {
				ws, _ := algo.WindowBoundsUs(l, tm)
				held[ws] += g
				if held[ws] > l.Rate {
					rt.Fatalf("window %d: %d units leased > rate %d", ws, held[ws], l.Rate)
				}
			}
			if r := rapid.Int64Range(0, 3).Draw(rt, "return"); r > 0 && r <= g {
				st, _ = algo.Release(l, st, now, r)
				if k == algo.FixedWindow {
					ws, _ := algo.WindowBoundsUs(l, tm)
					held[ws] -= r
				}
			}
		}
	})
}

func TestLeasable(t *testing.T) {
	for _, c := range []struct {
		l    algo.Limit
		want bool
	}{
		{algo.Limit{Kind: algo.FixedWindow}, true},
		{algo.Limit{Kind: algo.SlidingWindow}, true},
		{algo.Limit{Kind: algo.TokenBucket}, true},
		{algo.Limit{Kind: algo.SlidingLog}, false},
		{algo.Limit{Kind: algo.Concurrency}, false},
		{algo.Limit{Kind: algo.FixedWindow, Calendar: algo.CalendarMonth}, false},
	} {
		if got := algo.Leasable(c.l); got != c.want {
			t.Errorf("Leasable(%+v) = %v, want %v", c.l, got, c.want)
		}
	}
}
