package redis

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// runLean runs segs (made lean segments) as one lean.lua invocation on c
// (EVAL) and returns each segment's decisions and error as deliverLean
// gives them.
func runLean(t interface{ Fatalf(string, ...any) }, c goredis.UniversalClient, segs []*segment) ([][]algo.Decision, []error) {
	inv := &invocation{}
	outs := make([][]algo.Decision, len(segs))
	for i, sg := range segs {
		sg.lean = true
		outs[i] = make([]algo.Decision, len(sg.hits))
		inv.calls = append(inv.calls, newCall(context.Background(), sg, outs[i]))
	}
	inv.cmd = argsCmd(context.Background(), false, segmentsOf(inv.calls))
	if err := c.Process(context.Background(), inv.cmd); err != nil {
		t.Fatalf("lean invocation of %d segments: %v", len(segs), err)
	}
	deliverLean(inv, nil, func(*scriptCall) bool { return false })
	errs := make([]error, len(segs))
	for i, call := range inv.calls {
		<-call.done
		errs[i] = call.err
	}
	return outs, errs
}

// TestLeanBatchEqualsReference: random batches of up to 40 requests of
// sliding_window and token_bucket hits (several per request, repeated
// keys, checks, costs above capacity, soft, release and always_charge
// hits, denied-mode segments) in one lean.lua invocation give, segment by
// segment, algotest.Reference's decisions in order: each segment is
// all-or-nothing on its own and sees the writes of the segments before
// it. Batches at later instants follow on the same keys.
func TestLeanBatchEqualsReference(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	var run int
	rapid.Check(t, func(rt *rapid.T) {
		run++
		limits := []algo.Limit{
			{Kind: algo.SlidingWindow, Rate: rapid.Int64Range(1, 9).Draw(rt, "sw_rate"), Period: time.Duration(rapid.Int64Range(1, 90).Draw(rt, "sw_s"))*time.Second + 7*time.Microsecond},
			{Kind: algo.TokenBucket, Rate: rapid.Int64Range(1, 9).Draw(rt, "tb_rate"), Burst: rapid.Int64Range(0, 9).Draw(rt, "tb_burst"), Period: time.Duration(rapid.Int64Range(1, 90).Draw(rt, "tb_s"))*time.Second + 3*time.Microsecond},
		}
		keys := make([]string, 4)
		for i := range keys {
			keys[i] = fmt.Sprintf("lb:%d:%d", run, i)
		}
		limitOf := func(i int) algo.Limit { return limits[i%2] }
		states := map[string]algo.State{}
		now := batchEpoch
		for batch := range rapid.IntRange(1, 4).Draw(rt, "batches") {
			now = now.Add(time.Duration(rapid.Int64Range(0, 40_000_000).Draw(rt, "advance_us")) * time.Microsecond)
			nseg := rapid.IntRange(1, 40).Draw(rt, "segments")
			segs := make([]*segment, nseg)
			for s := range segs {
				hits := make([]algo.Hit, rapid.IntRange(1, 3).Draw(rt, "hits"))
				for i := range hits {
					k := rapid.IntRange(0, len(keys)-1).Draw(rt, "key")
					l := limitOf(k)
					hits[i] = algo.Hit{Key: keys[k], Limit: l, Cost: rapid.Int64Range(0, l.Rate+l.Burst+1).Draw(rt, "cost")}
					switch rapid.IntRange(0, 9).Draw(rt, "flag") {
					case 0:
						hits[i].Soft = true
					case 1:
						hits[i].Release = true
					case 2:
						hits[i].Charge = true
					}
				}
				mode := modeTake
				if rapid.IntRange(0, 9).Draw(rt, "denied?") == 0 {
					mode = modeDenied
				}
				segs[s] = &segment{mode: mode, nowUS: now.UnixMicro(), hits: hits}
			}
			outs, errs := runLean(rt, c, segs)
			for s, sg := range segs {
				if errs[s] != nil {
					rt.Fatalf("batch %d segment %d: %v", batch, s, errs[s])
				}
				want := referenceMode(states, sg.hits, now, sg.mode == modeDenied)
				if !slices.Equal(outs[s], want) {
					rt.Fatalf("batch %d segment %d (%s) %+v:\n redis %+v\n  algo %+v", batch, s, sg.mode, sg.hits, outs[s], want)
				}
			}
		}
	})
}

// referenceMode is algotest.Reference, or for a denied-mode segment
// (modeDenied) the request decided as if another of its parts had
// denied it: with a hit that always denies appended and its decision
// dropped.
func referenceMode(states map[string]algo.State, hits []algo.Hit, now time.Time, denied bool) []algo.Decision {
	if !denied {
		return algotest.Reference(states, hits, now)
	}
	blocker := algo.Hit{Key: "\x00blocker", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 0, Period: time.Hour}}
	return algotest.Reference(states, append(slices.Clone(hits), blocker), now)[:len(hits)]
}

// TestLeanRefund: mode r reverses a take exactly at the take's instant
// (the compensating refund of a Cluster request): the keys hold what they
// held before it, and each hit reports a check on the restored state.
func TestLeanRefund(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	now := batchEpoch.UnixMicro()
	sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 5, Period: time.Minute}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 3, Period: time.Second} // T = 333333 1/3 µs
	before := []algo.Hit{{Key: "r:s", Limit: sw, Cost: 1}, {Key: "r:t", Limit: tb, Cost: 1}}
	if _, errs := runLean(t, c, []*segment{{mode: modeTake, nowUS: now, hits: before}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	snapshot := func() []string {
		var out []string
		for _, h := range before {
			for _, k := range leanKeys(&h, now) {
				out = append(out, k+"="+c.Get(context.Background(), k).Val())
			}
		}
		return out
	}
	want := snapshot()
	take := []algo.Hit{{Key: "r:s", Limit: sw, Cost: 2}, {Key: "r:t", Limit: tb, Cost: 2}, {Key: "r:s", Limit: sw, Cost: 1}}
	if outs, errs := runLean(t, c, []*segment{{mode: modeTake, nowUS: now, hits: take}}); errs[0] != nil || !outs[0][0].Allowed || !outs[0][1].Allowed {
		t.Fatalf("take: %+v %v", outs, errs)
	}
	if got := snapshot(); slices.Equal(got, want) {
		t.Fatalf("the take changed nothing: %q", got)
	}
	outs, errs := runLean(t, c, []*segment{{mode: modeRefund, nowUS: now, hits: take}})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got := snapshot(); !slices.Equal(got, want) {
		t.Errorf("after the refund %q, want %q", got, want)
	}
	states := map[string]algo.State{}
	algotest.Reference(states, before, batchEpoch)
	for i, h := range take {
		_, d := algo.Take(h.Limit, states[h.Key], batchEpoch, 0)
		if outs[0][i] != d {
			t.Errorf("refund hit %d: %+v, want the check %+v", i, outs[0][i], d)
		}
	}
}

// TestLeanSegmentOOM: under a write refusal (OOM under noeviction) a lean
// segment that would write fails alone with OOM, a denial and a check are
// still decided, and nothing is written.
func TestLeanSegmentOOM(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 5, Period: time.Hour}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 5, Period: time.Hour}
	now := time.Date(2026, 3, 1, 10, 30, 0, 0, time.UTC).UnixMicro()
	full := []*segment{
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "a", Limit: sw, Cost: 5}}},
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "t", Limit: tb, Cost: 5}}},
	}
	if _, errs := runLean(t, c, full); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	keysBefore, _ := c.Keys(ctx, "*").Result()
	slices.Sort(keysBefore)
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	outs, errs := runLean(t, c, []*segment{
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "b", Limit: sw, Cost: 1}}},
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "a", Limit: sw, Cost: 1}}}, // denied: full
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "t", Limit: tb, Cost: 1}}}, // denied: empty bucket
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "c", Limit: sw, Cost: 0}}}, // check
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "d", Limit: tb, Cost: 1}, {Key: "e", Limit: sw, Cost: 1}}},
	})
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 4} {
		if CauseOf(errs[i]) != CauseOOM {
			t.Errorf("segment %d: %v (cause %q), want OOM", i, errs[i], CauseOf(errs[i]))
		}
	}
	if errs[1] != nil || outs[1][0].Allowed || outs[1][0].Remaining != 0 ||
		errs[2] != nil || outs[2][0].Allowed || outs[2][0].RetryAfter <= 0 ||
		errs[3] != nil || !outs[3][0].Allowed || outs[3][0].Remaining != 5 {
		t.Errorf("denials and check: %+v %v, %+v %v, %+v %v", outs[1], errs[1], outs[2], errs[2], outs[3], errs[3])
	}
	keys, _ := c.Keys(ctx, "*").Result()
	slices.Sort(keys)
	if !slices.Equal(keys, keysBefore) {
		t.Errorf("keys %q under OOM, want %q", keys, keysBefore)
	}
}

// TestLeanUniformBatch: a call whose segments are all a take of one hit
// of one limit and cost sends them in the short form (leanUniform) and
// decides them as algotest.Reference does, in order, on repeated keys.
func TestLeanUniformBatch(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	for _, l := range []algo.Limit{
		{Kind: algo.SlidingWindow, Rate: 3, Period: time.Minute},
		{Kind: algo.TokenBucket, Rate: 3, Period: time.Second},
	} {
		states := map[string]algo.State{}
		segs := make([]*segment, 20)
		for i := range segs {
			segs[i] = &segment{mode: modeTake, nowUS: batchEpoch.UnixMicro(), hits: []algo.Hit{{Key: fmt.Sprintf("u:%d:%d", l.Kind, i%3), Limit: l, Cost: 1}}}
		}
		as := make([]*segArgs, len(segs))
		for i, sg := range segs {
			sg.lean = true
			as[i] = new(segArgs)
			as[i].init(sg)
		}
		if args := argsCmd(context.Background(), false, as).Args(); !slices.Contains(args, argUniform) {
			t.Fatalf("%v: arguments %v, want the short form", l.Kind, args)
		}
		outs, errs := runLean(t, c, segs)
		for i, sg := range segs {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if want := algotest.Reference(states, sg.hits, batchEpoch); !slices.Equal(outs[i], want) {
				t.Errorf("%v segment %d: %+v, want %+v", l.Kind, i, outs[i], want)
			}
		}
	}
}
