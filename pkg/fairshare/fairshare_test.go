package fairshare_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/fairshare"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func drawDemand(rt *rapid.T, ids []string, maxD int64, label string) map[string]int64 {
	d := make(map[string]int64, len(ids))
	for _, id := range ids {
		d[id] = rapid.Int64Range(-3, maxD).Draw(rt, label+id)
	}
	return d
}

func drawIDs(rt *rapid.T) []string {
	n := rapid.IntRange(1, 12).Draw(rt, "subscribers")
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%02d", i)
	}
	return ids
}

func sum(m map[string]int64) int64 {
	var s int64
	for _, v := range m {
		s += v
	}
	return s
}

// maxMin is the max-min fair division by progressive filling, one unit at
// a time to the unsatisfied subscriber holding least (ties: smallest id).
func maxMin(remaining int64, want map[string]int64) map[string]int64 {
	out := map[string]int64{}
	ids := slices.Sorted(maps.Keys(want))
	for remaining > 0 {
		pick := ""
		for _, id := range ids {
			if out[id] >= max(want[id], 0) {
				continue
			}
			if pick == "" || out[id] < out[pick] {
				pick = id
			}
		}
		if pick == "" {
			break
		}
		out[pick]++
		remaining--
	}
	for _, id := range ids {
		out[id] += 0
	}
	return out
}

// The allowances never sum to more than the remainder and are never
// negative, whatever the rounds, subscribers and demands.
func TestSumNeverAboveRemainder(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		a := fairshare.New(fairshare.Options{Floor: rapid.Int64Range(0, 50).Draw(rt, "floor")})
		ids := drawIDs(rt)
		now := t0
		for r := range rapid.IntRange(1, 20).Draw(rt, "rounds") {
			live := rapid.SliceOfNDistinct(rapid.SampledFrom(ids), 0, len(ids), rapid.ID[string]).Draw(rt, "live")
			if rapid.Bool().Draw(rt, "forget") {
				a.Forget(rapid.SampledFrom(ids).Draw(rt, "forgotten"))
			}
			rem := rapid.Int64Range(-10, 5000).Draw(rt, "remaining")
			d := drawDemand(rt, live, 3000, "d")
			got := a.Allocate(now, rem, d)
			if s := sum(got); s > max(rem, 0) {
				rt.Fatalf("round %d: allowances sum to %d > remainder %d: %v", r, s, rem, got)
			}
			if len(got) != len(d) {
				rt.Fatalf("round %d: %d allowances for %d subscribers", r, len(got), len(d))
			}
			for id, g := range got {
				if g < 0 {
					rt.Fatalf("round %d: %s gets %d", r, id, g)
				}
				if _, ok := d[id]; !ok {
					rt.Fatalf("round %d: allowance for %s, which has no demand entry", r, id)
				}
			}
			now = now.Add(time.Second)
		}
	})
}

// convergeRounds is the number of rounds of steady demand after which the
// smoothed demand equals the demand for every gap below 2^20 (demands are
// drawn below 2^20): floor(log2(gap))+1 <= 20.
const convergeRounds = 20

// Under steady demand the allowances equal the max-min fair division from
// round convergeRounds on, whatever the demand history before.
func TestConvergesToMaxMin(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		a := fairshare.New(fairshare.Options{Floor: rapid.Int64Range(0, 50).Draw(rt, "floor")})
		ids := drawIDs(rt)
		now := t0
		for range rapid.IntRange(0, 5).Draw(rt, "history") {
			a.Allocate(now, rapid.Int64Range(0, 1<<20).Draw(rt, "hrem"), drawDemand(rt, ids, 1<<20-1, "h"))
			now = now.Add(time.Second)
		}
		steady := drawDemand(rt, ids, 3000, "steady")
		rem := rapid.Int64Range(0, 20000).Draw(rt, "remaining")
		var got map[string]int64
		for range convergeRounds {
			got = a.Allocate(now, rem, steady)
			now = now.Add(time.Second)
		}
		want := maxMin(rem, steady)
		for _, id := range ids {
			if got[id] != want[id] {
				rt.Fatalf("after %d steady rounds: %s gets %d, max-min fair is %d (all %v, fair %v)",
					convergeRounds, id, got[id], want[id], got, want)
			}
		}
	})
}

// A subscriber with no demand history gets the floor when the remainder
// covers the floors of all newcomers, however much the others demand.
func TestNewSubscriberGetsFloor(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		floor := rapid.Int64Range(1, 100).Draw(rt, "floor")
		a := fairshare.New(fairshare.Options{Floor: floor})
		ids := drawIDs(rt)
		now := t0
		old := ids[:rapid.IntRange(0, len(ids)-1).Draw(rt, "old")]
		if len(old) > 0 {
			a.Allocate(now, rapid.Int64Range(0, 5000).Draw(rt, "rem0"), drawDemand(rt, old, 5000, "d0"))
			now = now.Add(time.Second)
		}
		d := drawDemand(rt, old, 5000, "d1")
		fresh := ids[len(old):]
		for _, id := range fresh {
			d[id] = rapid.Int64Range(0, 5000).Draw(rt, "new"+id)
		}
		rem := rapid.Int64Range(floor*int64(len(fresh)), 20000).Draw(rt, "remaining")
		got := a.Allocate(now, rem, d)
		for _, id := range fresh {
			if got[id] < floor {
				rt.Fatalf("new subscriber %s gets %d < floor %d (remainder %d, %d new): %v", id, got[id], floor, rem, len(fresh), got)
			}
		}
	})
}

// Two allocators fed the same rounds compute the same division: every
// instance sharing demand through the store agrees on each one's share.
func TestDeterministic(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		floor := rapid.Int64Range(0, 30).Draw(rt, "floor")
		a, b := fairshare.New(fairshare.Options{Floor: floor}), fairshare.New(fairshare.Options{Floor: floor})
		ids := drawIDs(rt)
		for r := range rapid.IntRange(1, 10).Draw(rt, "rounds") {
			rem := rapid.Int64Range(0, 3000).Draw(rt, "rem")
			d := drawDemand(rt, ids, 1000, "d")
			ga, gb := a.Allocate(t0, rem, d), b.Allocate(t0, rem, maps.Clone(d))
			if !maps.Equal(ga, gb) {
				rt.Fatalf("round %d: %v != %v", r, ga, gb)
			}
		}
	})
}

func TestForgetMakesNew(t *testing.T) {
	a := fairshare.New(fairshare.Options{Floor: 10})
	if got := a.Allocate(t0, 100, map[string]int64{"a": 0}); got["a"] != 10 {
		t.Fatalf("new subscriber: %v, want the floor 10", got)
	}
	if got := a.Allocate(t0, 100, map[string]int64{"a": 0}); got["a"] != 0 {
		t.Fatalf("known subscriber with no demand: %v, want 0", got)
	}
	a.Forget("a")
	if got := a.Allocate(t0, 100, map[string]int64{"a": 0}); got["a"] != 10 {
		t.Fatalf("forgotten subscriber: %v, want the floor 10 again", got)
	}
}

// A fall in demand is smoothed: the share shrinks by half the gap per round.
func TestFallIsSmoothed(t *testing.T) {
	a := fairshare.New(fairshare.Options{})
	a.Allocate(t0, 1000, map[string]int64{"a": 400})
	var got []int64
	for range 4 {
		got = append(got, a.Allocate(t0, 1000, map[string]int64{"a": 0})["a"])
	}
	if want := []int64{200, 100, 50, 25}; !slices.Equal(got, want) {
		t.Fatalf("allowances after demand fell from 400 to 0: %v, want %v", got, want)
	}
}
