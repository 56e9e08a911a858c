package redis

import (
	"context"
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
