package redis

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// costField is the index in segArgs.ints of hit i's cost (after now_us,
// the hit count, and fieldsPerHit fields per earlier hit).
func costField(i int) int { return 2 + i*fieldsPerHit + 6 }

// kindField is the index in segArgs.ints of hit i's kind.
func kindField(i int) int { return 2 + i*fieldsPerHit }

// TestSegmentInvalidArguments: one invocation (one batch, as the batcher
// sends it, completed by invocation.deliver) holding segments the script
// must reject (a cost of 2^63-1 sent past the Go clamp, an invalid limit,
// an unknown kind) between good ones of every algorithm: each rejected
// segment fails alone with its own SegmentError (cause other, not an
// outage) and writes nothing; every other segment is decided exactly as
// algo decides it, in order. A cost of 2^63-1 through the clamp (2^53,
// algo.MaxCost) is no error: it is denied.
func TestSegmentInvalidArguments(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	ctx := context.Background()
	now := batchEpoch.UnixMicro()
	p := time.Hour
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: p}
	sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 10, Period: p}
	lg := algo.Limit{Kind: algo.SlidingLog, Rate: 10, Period: p}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 10, Period: p, Burst: 5}
	cc := algo.Limit{Kind: algo.Concurrency, Rate: 10, Period: p}
	hit := func(k string, l algo.Limit, cost int64) algo.Hit { return algo.Hit{Key: k, Limit: l, Cost: cost} }
	reqs := [][]algo.Hit{
		{hit("a", fw, 1)},
		{hit("b", fw, 1), hit("a", fw, 1)}, // hit 2's cost becomes 2^63-1 below
		{hit("a", fw, 2)},
		{hit("l2", algo.Limit{Kind: algo.SlidingLog, Rate: 10}, 1)}, // period 0
		{hit("t", tb, math.MaxInt64), hit("a", fw, 1)},              // clamped to 2^53: denied
		{hit("s", sw, 1), hit("l", lg, 1), hit("t", tb, 1), hit("c", cc, 1)},
		{hit("k", fw, 1)}, // kind becomes 9 below
		{hit("a", fw, 1), hit("c", cc, 2)},
	}
	bad := map[int]string{
		1: "ERR ratelimitd take.lua: invalid segment: cost of hit 2",
		3: "ERR ratelimitd take.lua: invalid segment: period of hit 1",
		6: "ERR ratelimitd take.lua: invalid segment: kind of hit 1",
	}
	calls := make([]*scriptCall, len(reqs))
	for i, h := range reqs {
		seg := segment{mode: modeTake, nowUS: now, nonce: "n" + strconv.Itoa(i), hits: h}
		calls[i] = newCall(ctx, &seg, make([]algo.Decision, len(h)))
	}
	if got := calls[4].args.ints[costField(0)]; got != algo.MaxCost {
		t.Fatalf("cost 2^63-1 sent as %d, want algo.MaxCost", got)
	}
	calls[1].args.ints[costField(1)] = math.MaxInt64 // what an unclamped store would send
	calls[6].args.ints[kindField(0)] = 9
	inv := &invocation{calls: calls, cmd: argsCmd(ctx, false, segmentsOf(calls))}
	if err := c.Process(ctx, inv.cmd); err != nil {
		t.Fatalf("the invocation failed as a whole: %v", err)
	}
	newBatcher(c, 1, DefaultTimeout, DefaultMaxWait, 0).deliver(inv)
	states := map[string]algo.State{}
	for i, call := range calls {
		<-call.done
		if want, ok := bad[i]; ok {
			var se SegmentError
			if !errors.As(call.err, &se) || string(se) != want {
				t.Errorf("segment %d: error %v, want SegmentError %q", i, call.err, want)
			}
			e, _ := Classify(call.err).(*Error)
			if e == nil || e.Cause() != CauseOther || e.Outage() {
				t.Errorf("segment %d: classified %#v, want cause other, not an outage", i, e)
			}
			continue
		}
		if call.err != nil {
			t.Fatalf("segment %d: %v", i, call.err)
		}
		want := algotest.Reference(states, reqs[i], batchEpoch)
		if !slices.Equal(call.out, want) {
			t.Errorf("segment %d %+v:\n redis %+v\n  algo %+v", i, reqs[i], call.out, want)
		}
	}
	if d := calls[4].out[0]; d.Allowed || d.RetryAfter <= 0 {
		t.Errorf("cost 2^53 on a token bucket of 5: %+v, want denied", d)
	}
	if d := calls[7].out[0]; !d.Allowed || d.Remaining != 6 {
		t.Errorf("last segment on a: %+v, want allowed with 6 remaining (segments 0, 2 and 7 only)", d)
	}
	if n := c.Exists(ctx, "b", "l2", "k").Val(); n != 0 {
		t.Errorf("rejected segments wrote %d keys", n)
	}
}

// TestSegmentDenied: a segment in mode "d" (a Cluster slot group whose
// request another group denied) is decided and written as that request
// on one server: its kept hits (release, always_charge) are written and
// report their own state, the others write nothing and report a check on
// the state before the request, for every kind, twice in a row (the
// second sees only the first's kept hits).
func TestSegmentDenied(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	ctx := context.Background()
	now := batchEpoch.UnixMicro()
	p := time.Hour
	for _, l := range []algo.Limit{
		{Kind: algo.FixedWindow, Rate: 3, Period: p},
		{Kind: algo.SlidingWindow, Rate: 3, Period: p},
		{Kind: algo.SlidingLog, Rate: 3, Period: p},
		{Kind: algo.TokenBucket, Rate: 3, Period: p},
		{Kind: algo.Concurrency, Rate: 3, Period: p},
	} {
		t.Run(algotest.KindName(l.Kind), func(t *testing.T) {
			pre := algotest.KindName(l.Kind) + ":"
			x, y, z := pre+"take", pre+"charge", pre+"release"
			states := map[string]algo.State{}
			// z holds 2 units before, so that its release returns one
			seed := []algo.Hit{{Key: z, Limit: l, Cost: 2}}
			sc := newCall(ctx, &segment{mode: modeTake, nowUS: now, nonce: "seed", hits: seed}, make([]algo.Decision, 1))
			inv := &invocation{calls: []*scriptCall{sc}, cmd: argsCmd(ctx, false, segmentsOf([]*scriptCall{sc}))}
			if err := c.Process(ctx, inv.cmd); err != nil {
				t.Fatal(err)
			}
			b := newBatcher(c, 1, DefaultTimeout, DefaultMaxWait, 0)
			b.deliver(inv)
			<-sc.done
			algotest.Reference(states, seed, batchEpoch)
			hits := []algo.Hit{
				{Key: x, Limit: l, Cost: 1},
				{Key: y, Limit: l, Cost: 2, Charge: true},
				{Key: z, Limit: l, Cost: 1, Release: true},
			}
			// the request on one server: these hits and the other group's denial
			denier := algo.Hit{Key: pre + "other-group", Limit: l, Cost: algo.MaxCost}
			for round := range 2 {
				call := newCall(ctx, &segment{mode: modeDenied, nowUS: now, nonce: "d" + strconv.Itoa(round), hits: hits}, make([]algo.Decision, len(hits)))
				inv := &invocation{calls: []*scriptCall{call}, cmd: argsCmd(ctx, false, segmentsOf([]*scriptCall{call}))}
				if err := c.Process(ctx, inv.cmd); err != nil {
					t.Fatal(err)
				}
				b.deliver(inv)
				<-call.done
				if call.err != nil {
					t.Fatalf("round %d: %v", round, call.err)
				}
				want := algotest.Reference(states, append(slices.Clone(hits), denier), batchEpoch)[:len(hits)]
				if !slices.Equal(call.out, want) {
					t.Errorf("round %d:\n redis %+v\n  algo %+v", round, call.out, want)
				}
			}
			if n := c.Exists(ctx, x).Val(); n != 0 {
				t.Errorf("%s written by a denied group", x)
			}
			charged := int64(1)
			if l.Kind == algo.Concurrency { // a lease is never charged
				charged = 0
			}
			if n := c.Exists(ctx, y).Val(); n != charged {
				t.Errorf("%s exists %d, want %d (always_charge is kept)", y, n, charged)
			}
		})
	}
}
