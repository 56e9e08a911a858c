package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestWindowSingleDecision: a window segment of one hit sent alone (the
// short layouts' lone decision, which window.lua decides before anything
// else) counts like algo's fixed window for a cost of 1 and of 3: each
// allowed hit adds its cost, a denied one leaves the count as it was, the
// key gets its TTL once; under a write refusal (OOM) a hit that is over
// is still denied, one that would be allowed fails with OOM, and nothing
// is written.
func TestWindowSingleDecision(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	const rate = 5
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: rate, Period: time.Hour}
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).UnixMicro()
	one := func(key string, cost int64) (algo.Decision, error) {
		outs, inv := invokeWindow([]*segment{{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: key, Limit: fw, Cost: cost}}}})
		if d, ones := windowDirect(segmentsOf(inv.calls)); !d || ones != (cost == 1) {
			t.Fatalf("cost %d: direct %v, ones %v; want the short layout", cost, d, ones)
		}
		if err := c.Process(ctx, inv.cmd); err != nil {
			t.Fatalf("window invocation: %v", err)
		}
		if _, ok := inv.cmd.Val().(int64); !ok && inv.cmd.Err() == nil {
			if _, isErr := inv.cmd.Val().([]any); !isErr {
				t.Fatalf("reply %T, want an integer or a segment error", inv.cmd.Val())
			}
		}
		deliverWindow(inv, nil, func(*scriptCall) bool { return false })
		<-inv.calls[0].done
		return outs[0][0], inv.calls[0].err
	}
	ws := now - now%fw.Period.Microseconds()
	for _, cost := range []int64{1, 3} {
		key := fmt.Sprintf("k%d", cost)
		wkey := windowKey(key, ws)
		count := int64(0)
		for i := range 2*rate/cost + 1 {
			d, err := one(key, cost)
			if err != nil {
				t.Fatalf("cost %d hit %d: %v", cost, i, err)
			}
			allow := count+cost <= rate
			if allow {
				count += cost
			}
			rem := max(rate-count, 0)
			if d.Allowed != allow || d.Remaining != rem {
				t.Errorf("cost %d hit %d: allowed %v remaining %d, want %v %d", cost, i, d.Allowed, d.Remaining, allow, rem)
			}
			if !d.Allowed && d.RetryAfter <= 0 {
				t.Errorf("cost %d hit %d: denied without RetryAfter", cost, i)
			}
			got, err := c.Get(ctx, wkey).Int64()
			if err != nil || got != count {
				t.Errorf("cost %d hit %d: count %d (%v), want %d", cost, i, got, err, count)
			}
		}
		pttl, err := c.PTTL(ctx, wkey).Result()
		if err != nil || pttl <= 0 || pttl > time.Duration(windowTTL(fw.Period.Microseconds()))*time.Millisecond {
			t.Errorf("cost %d: PTTL %v (%v), want within the window's TTL", cost, pttl, err)
		}
	}

	// Under OOM: k3 holds 3 of 5, so a cost of 3 is over and a cost of 1
	// would be allowed; a new key would be allowed.
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	over, errOver := one("k3", 3)
	_, errAllow := one("k3", 1)
	_, errNew := one("new", 1)
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if errOver != nil || over.Allowed || over.Remaining != 2 {
		t.Errorf("over the limit under OOM: %+v %v, want a denial with 2 remaining", over, errOver)
	}
	for name, err := range map[string]error{"allowed hit": errAllow, "new key": errNew} {
		if CauseOf(err) != CauseOOM {
			t.Errorf("%s under OOM: %v (cause %q), want OOM", name, err, CauseOf(err))
		}
	}
	if got, err := c.Get(ctx, windowKey("k3", ws)).Int64(); err != nil || got != 3 {
		t.Errorf("k3 after OOM: %d (%v), want 3", got, err)
	}
	if n, err := c.Exists(ctx, windowKey("new", ws)).Result(); err != nil || n != 0 {
		t.Errorf("new key written under OOM: %d (%v)", n, err)
	}
}
