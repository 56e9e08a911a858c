package redis_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

func genLimit(t *rapid.T, kind algo.Kind) algo.Limit {
	l := algo.Limit{
		Kind: kind,
		Rate: rapid.Int64Range(0, 12).Draw(t, "rate"),
		// Periods of seconds and more (plus odd microseconds, so that
		// P/R has a fraction): the test's pinned clock then runs far ahead
		// of real time and no key expires in Redis before its state is
		// empty for pkg/algo.
		Period: time.Duration(rapid.Int64Range(5, 120).Draw(t, "period_s"))*time.Second +
			time.Duration(rapid.Int64Range(0, 999_999).Draw(t, "period_us"))*time.Microsecond,
	}
	if rapid.IntRange(0, 9).Draw(t, "rate0") != 0 && l.Rate == 0 {
		l.Rate = 1
	}
	switch kind {
	case algo.TokenBucket:
		l.Burst = rapid.Int64Range(0, 15).Draw(t, "burst")
	case algo.FixedWindow, algo.SlidingWindow:
		if rapid.IntRange(0, 3).Draw(t, "calendar?") == 0 {
			l.Calendar = algo.Calendar(rapid.IntRange(1, 2).Draw(t, "calendar"))
			l.Multiplier = rapid.Int64Range(1, 3).Draw(t, "multiplier")
			l.Period = 30 * 24 * time.Hour
		}
	}
	return l
}

// drawHit draws one hit on one of the two keys names[0], names[1] with
// its limit from limits: a cost from 0 to Rate+Burst+2 (above capacity
// included), soft one time in five.
func drawHit(rt *rapid.T, names []string, limits map[string]algo.Limit) algo.Hit {
	k := names[rapid.IntRange(0, 1).Draw(rt, "key")]
	l := limits[k]
	h := algo.Hit{Key: k, Limit: l, Cost: rapid.Int64Range(0, l.Rate+l.Burst+2).Draw(rt, "cost")}
	h.Soft = rapid.IntRange(0, 4).Draw(rt, "soft?") == 0
	return h
}

// stepSpan is the time scale of the clock steps for limit l: its Period,
// or 400 days for a calendar window (whose Period field is a placeholder).
func stepSpan(l algo.Limit) time.Duration {
	if l.Calendar != algo.CalendarNone {
		return 400 * 24 * time.Hour
	}
	return l.Period
}

var agreeCase atomic.Int64

// TestAgreement: random schedules of (advance, hits) give identical
// decisions from the Lua script (pinned clock, real redis-server) and from
// pkg/algo, step by step, for every algorithm, including multi-hit
// requests with repeated keys, checks, costs above capacity, releases
// (refunds) on every algorithm, always_charge hits (per key, and mixed
// with all_or_nothing hits on one key), penalty boxes and the clock going
// backwards.
func TestAgreement(t *testing.T) {
	srv := redistest.Standalone(t)
	clk := newPinnedClock(epoch0)
	agree(t, newTestStore(t, srv, clk.Now, 0), clk, agreeOpts{})
}

// TestAgreementCluster is TestAgreement through a 3-master Cluster: the two
// keys of a schedule live in different slots, so a denial in one slot group
// is compensated by a refund in the others, and the answers must still
// equal pkg/algo's step by step. always_charge is drawn per key, as a
// rule's counting policy is. Left out are the two cases compensation
// cannot reverse (docs/redis.md): releases mixed with takes in one group,
// and the clock going backwards (a refund restores a state equivalent at
// the take's instant and after, not before it).
func TestAgreementCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	g := redistest.Cluster(t, 3)
	clk := newPinnedClock(epoch0)
	agree(t, newClusterStore(t, g, clk.Now), clk, agreeOpts{compensated: true})
}

// TestAgreementWindowKeys is TestAgreement with Options.WindowKeys (the
// clock never goes back: see windowTables): with epoch-aligned windows
// only, every request is one window.lua segment; with calendar windows
// or penalty boxes too, a request mixing both is decided as slot groups,
// so the exclusions of TestAgreementCluster apply.
func TestAgreementWindowKeys(t *testing.T) {
	srv := redistest.Standalone(t)
	clk := newPinnedClock(epoch0)
	s := windowStore(t, srv, clk.Now)
	t.Run("aligned", func(t *testing.T) { agree(t, s, clk, agreeOpts{noBack: true, noCalendar: true, noPenalty: true}) })
	t.Run("mixed", func(t *testing.T) { agree(t, s, clk, agreeOpts{compensated: true}) })
}

// TestAgreementClusterWindowKeys is TestAgreementCluster with
// Options.WindowKeys.
func TestAgreementClusterWindowKeys(t *testing.T) {
	g := redistest.Cluster(t, 3)
	clk := newPinnedClock(epoch0)
	o := redis.DefaultOptions()
	o.Mode = redis.Cluster
	o.URL = ""
	o.Addrs = g.Addrs()
	o.Timeout = 5 * time.Second
	o.DialTimeout = 2 * time.Second
	o.MaxWait = stateWithin // as newClusterStore
	o.PoolSize = 8
	o.Now = clk.Now
	o.WindowKeys = true
	agree(t, openStore(t, o), clk, agreeOpts{compensated: true})
}

// agreeOpts narrow what agree draws: compensated leaves out releases,
// always_charge flips within a key and backward clock steps (see
// TestAgreementCluster); noBack backward clock steps only (window keys
// count in the window the clock names); noCalendar calendar windows;
// noPenalty penalty boxes (with window keys, take.lua decides a hit with
// one, so a request holding one is decided as slot groups).
type agreeOpts struct{ compensated, noBack, noCalendar, noPenalty bool }

// agree runs the agreement property on s, as narrowed by o.
func agree(t *testing.T, s *redis.Store, clk *pinnedClock, o agreeOpts) {
	compensated, noBack := o.compensated, o.noBack
	ctx := context.Background()
	kinds := []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket, algo.Concurrency}
	for _, kind := range kinds {
		t.Run(kindName(algo.Limit{Kind: kind}), func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				n := agreeCase.Add(1)
				ka, kb := fmt.Sprintf("agree:%d:a", n), fmt.Sprintf("agree:%d:b", n)
				for i := 0; redis.Slot(ka) == redis.Slot(kb); i++ {
					kb = fmt.Sprintf("agree:%d:b%d", n, i)
				}
				limits := map[string]algo.Limit{ka: genLimit(rt, kind), kb: genLimit(rt, kind)}
				if o.noCalendar {
					for k, l := range limits {
						if l.Calendar != algo.CalendarNone {
							l.Calendar, l.Multiplier, l.Period = algo.CalendarNone, 0, 90*time.Second+7*time.Microsecond
							limits[k] = l
						}
					}
				}
				charged := map[string]bool{ka: rapid.IntRange(0, 2).Draw(rt, "charge_a") == 0, kb: rapid.IntRange(0, 2).Draw(rt, "charge_b") == 0}
				// a penalty box on each key one time in two
				boxes := map[string]algo.Penalty{}
				for k, l := range limits {
					if !o.noPenalty && rapid.IntRange(0, 1).Draw(rt, "penalty?") == 0 {
						sp := stepSpan(l)
						boxes[k] = algo.Penalty{
							After:  rapid.Int64Range(1, 3).Draw(rt, "after"),
							Within: time.Duration(rapid.Int64Range(1, int64(2*sp/time.Microsecond)).Draw(rt, "within_us")) * time.Microsecond,
							Block:  time.Duration(rapid.Int64Range(1, int64(sp/time.Microsecond)).Draw(rt, "block_us")) * time.Microsecond,
							Extend: rapid.Bool().Draw(rt, "extend"),
						}
					}
				}
				var names []string
				for k := range limits {
					names = append(names, k)
				}
				now := epoch0.Add(time.Duration(rapid.Int64Range(0, 1e12).Draw(rt, "start_us")) * time.Microsecond)
				states := map[string]algo.State{}
				steps := rapid.IntRange(1, 40).Draw(rt, "steps")
				for step := range steps {
					span := stepSpan(limits[names[0]])
					switch rapid.IntRange(0, 9).Draw(rt, "advance_kind") {
					case 0: // same instant
					case 1: // clock goes back a little
						if compensated || noBack {
							break
						}
						now = now.Add(-time.Duration(rapid.Int64Range(1, 2_000_000).Draw(rt, "back_us")) * time.Microsecond)
					case 2: // long idle
						now = now.Add(time.Duration(rapid.Int64Range(0, int64(3*span/time.Microsecond)).Draw(rt, "idle_us")) * time.Microsecond)
					default:
						now = now.Add(time.Duration(rapid.Int64Range(0, int64(span/time.Microsecond)/4).Draw(rt, "adv_us")) * time.Microsecond)
					}
					nh := rapid.IntRange(1, 3).Draw(rt, "hits")
					hits := make([]algo.Hit, nh)
					for i := range hits {
						hits[i] = drawHit(rt, names, limits)
						hits[i].Charge = charged[hits[i].Key]
						hits[i].Penalty = boxes[hits[i].Key]
						if !compensated {
							if rapid.IntRange(0, 5).Draw(rt, "flip_charge?") == 0 {
								hits[i].Charge = !hits[i].Charge
							}
							if rapid.IntRange(0, 3).Draw(rt, "release?") == 0 {
								hits[i].Release = true
							}
						}
					}
					want := algotest.Reference(states, hits, now)
					rt.Logf("step %d at %d: hits %+v -> %+v", step, now.UnixMicro(), hits, want)
					clk.Set(now)
					got, err := algotest.Take(ctx, s, hits)
					if err != nil {
						rt.Fatalf("step %d: %v", step, err)
					}
					for i := range hits {
						if got[i] != want[i] {
							rt.Fatalf("step %d at %d µs, hit %d %+v:\n redis %+v\n  algo %+v", step, now.UnixMicro(), i, hits[i], got[i], want[i])
						}
					}
				}
			})
		})
	}
}

// TestPinnedClockKeyOutlastsRealTime: with a pinned clock, a state key
// written a microsecond before its state empties keeps a TTL of at least
// an hour of real time, whether a lone hit (take1.lua) or a request of
// two (take.lua) wrote it. Redis expires keys by real time, which passes
// between a schedule's steps (TestAgreement) however the pinned clock
// moves: a shorter TTL lets a starved host expire a count that the next
// step, at the same pinned instant, must still see.
func TestPinnedClockKeyOutlastsRealTime(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: 5 * time.Second}
	p := l.Period.Microseconds()
	// the last microsecond of an epoch-aligned window
	end := time.UnixMicro((epoch0.UnixMicro()/p + 1) * p)
	clk := newPinnedClock(end.Add(-time.Microsecond))
	s := newTestStore(t, srv, clk.Now, 0)
	for _, keys := range [][]string{{"pinned:lone"}, {"pinned:a", "pinned:b"}} {
		hits := make([]algo.Hit, len(keys))
		for i, k := range keys {
			hits[i] = algo.Hit{Key: k, Limit: l, Cost: 1}
		}
		written := time.Now() // the keys are written after this
		for i, want := range []bool{true, false} {
			d, err := algotest.Take(ctx, s, hits)
			if err != nil {
				t.Fatal(err)
			}
			if d[0].Allowed != want {
				t.Fatalf("%q take %d at the window's last microsecond: %+v, want allowed %v", keys, i, d, want)
			}
		}
		for _, k := range keys {
			ttl, err := srv.Client().PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			// an hour from the write, of which some real time has passed
			if want := time.Hour - time.Since(written); ttl < want {
				t.Errorf("PTTL %s = %v with a pinned clock, want at least %v (an hour from the write)", k, ttl, want)
			}
		}
	}
}
