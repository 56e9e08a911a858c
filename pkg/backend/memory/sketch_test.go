package memory

import (
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
)

// TestSketchNeverUnderCounts is the property the full store relies on: on
// any sequence of hits (takes, always_charge takes, checks, releases, a
// clock moving by up to two periods) over keys that collide in a tiny
// sketch, each decided on the key's estimate and merged back as the store
// does, (1) no hit is admitted that the key's exact state (fed with the
// same decisions) denies, and (2) after every hit, every key's estimate
// leaves no more remaining than its exact state.
func TestSketchNeverUnderCounts(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var ss sketches
		ss.init(rapid.IntRange(1, 8).Draw(rt, "width"), rapid.IntRange(1, 3).Draw(rt, "depth"))
		ss.hash = func(k string) uint64 { // fixed, so that a failure reproduces
			h := fnv.New64a()
			h.Write([]byte(k))
			return h.Sum64()
		}
		kind := rapid.SampledFrom([]algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.TokenBucket}).Draw(rt, "kind")
		l := algo.Limit{Kind: kind, Rate: rapid.Int64Range(1, 6).Draw(rt, "rate"),
			Period: time.Duration(rapid.IntRange(1, 30).Draw(rt, "period_ms")) * time.Millisecond}
		if kind == algo.TokenBucket {
			l.Burst = l.Rate + rapid.Int64Range(0, 3).Draw(rt, "extra_burst")
		}
		if ss.make(l) == nil {
			rt.Fatal("no sketch")
		}
		nowUs := algotest.Base.UnixMicro() + rapid.Int64Range(0, 1e6).Draw(rt, "start_us")
		nkeys := rapid.IntRange(1, 12).Draw(rt, "keys")
		exact := make([]algo.State, nkeys)
		steps := rapid.IntRange(1, 200).Draw(rt, "steps")
		for step := range steps {
			nowUs += rapid.Int64Range(0, 2*l.Period.Microseconds()).Draw(rt, "advance_us")
			now := time.UnixMicro(nowUs)
			k := rapid.IntRange(0, nkeys-1).Draw(rt, "key")
			key := fmt.Sprint("key", k)
			h := algo.Hit{Key: key, Limit: l, Cost: rapid.Int64Range(0, 3).Draw(rt, "cost")}
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0:
				h.Release = true
			case 1:
				h.Charge = true
			}
			est := ss.estimate(l, key, nowUs)
			ns, d := algo.Apply(est, h, now)
			xs, xd := algo.Apply(exact[k], h, now)
			if d.Allowed && !xd.Allowed {
				rt.Fatalf("step %d: %+v admitted on estimate %+v, exact state %+v denies it", step, h, est, exact[k])
			}
			if d.Allowed || h.Kept() {
				ss.merge(l, key, ns)
				exact[k] = xs
			}
			for j := range nkeys {
				e := ss.estimate(l, fmt.Sprint("key", j), nowUs)
				_, de := algo.Take(l, e, now, 0)
				_, dx := algo.Take(l, exact[j], now, 0)
				if de.Remaining > dx.Remaining {
					rt.Fatalf("step %d: key%d estimate %+v leaves %d, exact state %+v leaves %d", step, j, e, de.Remaining, exact[j], dx.Remaining)
				}
			}
		}
	})
}
