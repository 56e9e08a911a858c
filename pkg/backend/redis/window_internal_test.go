package redis

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// invokeWindow is the window.lua invocation of segs (made window
// segments) and its calls, whose replies deliverWindow decodes.
func invokeWindow(segs []*segment) ([][]algo.Decision, *invocation) {
	inv := &invocation{}
	outs := make([][]algo.Decision, len(segs))
	for i, sg := range segs {
		sg.window = true
		outs[i] = make([]algo.Decision, len(sg.hits))
		inv.calls = append(inv.calls, newCall(context.Background(), sg, outs[i]))
		inv.calls[i].window = true
	}
	inv.cmd = argsCmd(context.Background(), false, segmentsOf(inv.calls))
	return outs, inv
}

// TestWindowSegmentOOM: under a write refusal (OOM under noeviction) a
// window segment that would allow fails alone with OOM, a denial and a
// check are still decided, and nothing is written.
func TestWindowSegmentOOM(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Hour}
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).UnixMicro()
	run := func(segs []*segment) ([][]algo.Decision, []error) {
		outs, inv := invokeWindow(segs)
		if err := c.Process(ctx, inv.cmd); err != nil {
			t.Fatalf("window invocation: %v", err)
		}
		deliverWindow(inv, nil, func(*scriptCall) bool { return false })
		errs := make([]error, len(segs))
		for i, call := range inv.calls {
			<-call.done
			errs[i] = call.err
		}
		return outs, errs
	}
	if _, errs := run([]*segment{{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "a", Limit: fw, Cost: 5}}}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	outs, errs := run([]*segment{
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "b", Limit: fw, Cost: 1}}},
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "a", Limit: fw, Cost: 1}}}, // denied: full
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "c", Limit: fw, Cost: 0}}}, // check
		{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: "d", Limit: fw, Cost: 1}, {Key: "e", Limit: fw, Cost: 1}}},
	})
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 3} {
		if CauseOf(errs[i]) != CauseOOM {
			t.Errorf("segment %d: %v (cause %q), want OOM", i, errs[i], CauseOf(errs[i]))
		}
	}
	if errs[1] != nil || outs[1][0].Allowed || outs[1][0].Remaining != 0 || errs[2] != nil || !outs[2][0].Allowed || outs[2][0].Remaining != 5 {
		t.Errorf("denial and check: %+v %v, %+v %v", outs[1], errs[1], outs[2], errs[2])
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Errorf("keys %q under OOM, want the window key of a only", keys)
	}
}

// TestBatchLenWindow: a flush takes up to maxWindowHits window-key hits
// (one window.lua invocation), up to maxBatch take.lua segments next to
// them, and a request's hits whole.
func TestBatchLenWindow(t *testing.T) {
	call := func(window bool, hits int) *scriptCall {
		c := &scriptCall{window: window}
		c.args.keys = make([]string, hits)
		return c
	}
	var q []*scriptCall
	for range 300 {
		q = append(q, call(true, 1))
	}
	if n := batchLen(q); n != 128 {
		t.Errorf("300 one-hit window calls: a flush takes %d, want 128", n)
	}
	var mixed []*scriptCall
	for range 200 {
		mixed = append(mixed, call(true, 1), call(false, 1))
	}
	// 64 of each, then one more window call before the 65th take.lua one.
	if n := batchLen(mixed); n != 2*maxBatch+1 {
		t.Errorf("alternating window and take.lua calls: a flush takes %d, want %d", n, 2*maxBatch+1)
	}
	// A request of three hits is not split: the flush stops before it.
	q = q[:127:127]
	q = append(q, call(true, 3), call(true, 1))
	if n := batchLen(q); n != 127 {
		t.Errorf("127 hits then a 3-hit request: a flush takes %d calls, want 127", n)
	}
	if n := batchLen([]*scriptCall{call(true, 200)}); n != 1 {
		t.Errorf("a 200-hit request: %d calls, want 1 (alone)", n)
	}
}

// TestWindowClock: a master's window clock asks for a check until a
// checked reply gave it an estimate, then not again within clockRefresh;
// a failed check, or a reply whose round trip exceeded clockMaxRTT, makes
// the next call check; the estimate runs from the server's now by the
// local monotonic time, never ahead of it.
func TestWindowClock(t *testing.T) {
	k := windowClock{epoch: time.Now()}
	for i := range 3 {
		if _, _, check := k.now(); !check {
			t.Fatalf("call %d without a verified estimate: no check", i)
		}
	}
	const server = int64(1_800_000_000_000_000)
	_, sent, _ := k.now()
	k.observe(server, sent)
	est, _, check := k.now()
	after := k.mono()
	if check {
		t.Fatal("a call right after a verified estimate checks again")
	}
	// est = server + (mono at est - mono at observe): within what passed.
	if est < server || est > server+(after-sent) {
		t.Fatalf("estimate %d, want within [%d, %d]", est, server, server+(after-sent))
	}
	k.failed()
	if _, _, check := k.now(); !check {
		t.Fatal("after a failed check: no check")
	}
	if _, _, check := k.now(); check {
		t.Fatal("two calls took the check")
	}
	// A reply from a round trip above clockMaxRTT is not taken.
	off := k.off.Load()
	k.observe(server+1_000_000_000, k.mono()-clockMaxRTT.Microseconds()-1)
	if k.off.Load() != off {
		t.Fatal("an estimate from a slow round trip was taken")
	}
	if _, _, check := k.now(); !check {
		t.Fatal("after a slow round trip: no check")
	}
}

// TestWindowOneHitAllocs bounds the allocations of the Go side of a
// request's usual window segment, a take of one hit: copying its
// arguments allocates the window key's string only, its window1.lua
// command the []any and the Cmd, and decoding the count nothing. The command and the decision are checked too, so that the
// count is of the path a request takes.
func TestWindowOneHitAllocs(t *testing.T) {
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	est := time.Date(2026, 3, 1, 10, 20, 0, 0, time.UTC).UnixMicro()
	ws := est - est%fw.Period.Microseconds()
	sg := &segment{mode: modeTake, nowUS: -1, estUS: est, window: true,
		hits: []algo.Hit{{Key: "allocs:user:u1", Limit: fw, Cost: 1}}}
	c := &scriptCall{done: make(chan struct{}, 1), out: make([]algo.Decision, 1)}
	segs := []*segArgs{&c.args}
	ctx := context.Background()
	inv := &invocation{calls: []*scriptCall{c}}
	remaining := int64(fw.Rate - 1)
	reply := any(int64(1)) // window1.lua's count: the first hit, allowed
	stalled := func(*scriptCall) bool { return false }
	steps := []struct {
		name  string
		bound float64
		run   func()
	}{
		{"init", 1, func() {
			c.args = segArgs{}
			c.args.init(sg)
		}},
		{"argsCmd", 2, func() { inv.cmd = argsCmd(ctx, true, segs) }},
		{"deliverWindow", 0, func() {
			c.state.Store(callPending)
			inv.cmd.SetVal(reply)
			deliverWindow(inv, nil, stalled)
			<-c.done
		}},
	}
	for _, s := range steps {
		if n := testing.AllocsPerRun(200, s.run); n > s.bound {
			t.Errorf("%s: %v allocations, want at most %v", s.name, n, s.bound)
		}
	}
	key := "{allocs:user:u1}" + windowKeyVersion + strconv.FormatInt(ws, 10)
	want := []string{"evalsha", window1Script.Hash(), "1", key,
		strconv.FormatInt(fw.Rate, 10), strconv.FormatInt(windowTTL(fw.Period.Microseconds(), 0), 10)}
	if got := cmdArgs(inv.cmd); !slices.Equal(got, want) {
		t.Errorf("command %q, want %q", got, want)
	}
	reset := time.Duration(ws+fw.Period.Microseconds()-est) * time.Microsecond
	want0 := algo.Decision{Allowed: true, Remaining: remaining, ResetAfter: reset, WindowAfter: reset}
	if c.err != nil || c.now != est || c.out[0] != want0 {
		t.Errorf("decision %+v at %d (%v), want %+v at %d", c.out[0], c.now, c.err, want0, est)
	}
}
