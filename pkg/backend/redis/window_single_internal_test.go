package redis

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestWindowSingleDecision: a window segment of one hit sent alone (the
// lone decision, which window1.lua decides) counts like algo's fixed
// window for a cost of 1 and of 3: each allowed hit adds its cost, a
// denied one leaves the count as it was, the key gets its TTL once;
// under a write refusal (OOM) a hit that is over is still denied, one
// that would be allowed fails with OOM, and nothing is written.
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
		if err != nil || pttl <= 0 || pttl > time.Duration(windowTTL(fw.Period.Microseconds(), pinnedSlackMs))*time.Millisecond {
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

// windowLuaPrev is the window.lua of the previous release, which decided
// a lone take itself; kept to check that a rolling upgrade mixes it with
// window1.lua.
//
//go:embed testdata/window_prev.lua
var windowLuaPrev string

// TestWindowLoneMix: window1.lua (the Store's lone decision, by EVAL and
// as the FCALL of its function library), window.lua
// (a batch's short layout) and the previous release's window.lua decide
// takes on the same window keys in random order, as instances of two
// releases do during a rolling upgrade, and agree with a count kept here:
// each allowed hit adds its cost (1–3), a denied one leaves the count as
// it was. A key's TTL is set when a hit creates it and never extended by
// a later hit (the key's deadline stays where its window put it); a key
// whose TTL was lost (PERSIST) still counts exactly.
func TestWindowLoneMix(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	const rate = 7
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: rate, Period: time.Hour}
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).UnixMicro()
	ws := now - now%fw.Period.Microseconds()
	ttl := windowTTL(fw.Period.Microseconds(), pinnedSlackMs)
	rng := rand.New(rand.NewPCG(1, 2))
	// lone decides one hit through the Store's path (window1.lua).
	lone := func(key string, cost int64) int64 {
		outs, inv := invokeWindow([]*segment{{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: key, Limit: fw, Cost: cost}}}})
		if inv.cmd.Args()[1] != window1Lua {
			t.Fatalf("a lone take went to another script")
		}
		if err := c.Process(ctx, inv.cmd); err != nil {
			t.Fatalf("window1.lua: %v", err)
		}
		deliverWindow(inv, nil, func(*scriptCall) bool { return false })
		<-inv.calls[0].done
		if err := inv.calls[0].err; err != nil {
			t.Fatalf("window1.lua: %v", err)
		}
		d := outs[0][0]
		code := d.Remaining * 2
		if d.Allowed {
			code++
		}
		return code
	}
	// short decides one hit with script's short layout (rate ttl cost).
	short := func(script, key string, cost int64) int64 {
		v, err := c.Eval(ctx, script, []string{windowKey(key, ws)}, rate, ttl, cost).Result()
		if err != nil {
			t.Fatalf("window script: %v", err)
		}
		switch r := v.(type) {
		case int64:
			return r
		case []any:
			if len(r) == 1 {
				if code, ok := r[0].(int64); ok {
					return code
				}
			}
		}
		t.Fatalf("window script reply %v", v)
		return 0
	}
	// fcall decides one hit as the Store does once the function library
	// is loaded (FCALL of window1Func, window1.lua's body).
	if err := c.FunctionLoadReplace(ctx, window1Library).Err(); err != nil {
		t.Fatal(err)
	}
	fcall := func(key string, cost int64) int64 {
		outs, inv := invokeWindow([]*segment{{mode: modeTake, nowUS: now, hits: []algo.Hit{{Key: key, Limit: fw, Cost: cost}}}})
		inv.cmd = argsWindowFcall(ctx, segmentsOf(inv.calls)[0])
		if err := c.Process(ctx, inv.cmd); err != nil {
			t.Fatalf("FCALL %s: %v", window1Func, err)
		}
		deliverWindow(inv, nil, func(*scriptCall) bool { return false })
		<-inv.calls[0].done
		if err := inv.calls[0].err; err != nil {
			t.Fatalf("FCALL %s: %v", window1Func, err)
		}
		d := outs[0][0]
		code := d.Remaining * 2
		if d.Allowed {
			code++
		}
		return code
	}
	keys := []string{"mix:a", "mix:b", "mix:c", "mix:lost"}
	count := map[string]int64{}
	news := 0 // hits that created their key
	for i := range 400 {
		key := keys[rng.IntN(len(keys))]
		cost := 1 + rng.Int64N(3)
		var code int64
		via := rng.IntN(4)
		switch via {
		case 0:
			code = lone(key, cost)
		case 3:
			code = fcall(key, cost)
		case 1:
			code = short(windowLua, key, cost)
		default:
			code = short(windowLuaPrev, key, cost)
		}
		wkey := windowKey(key, ws)
		n := count[key]
		allow := n+cost <= rate
		rem := max(rate-n, 0)
		if allow {
			rem = rate - n - cost
		}
		if want := rem*2 + map[bool]int64{true: 1}[allow]; code != want {
			t.Fatalf("hit %d on %s (cost %d, count %d, script %d): code %d, want %d", i, key, cost, n, via, code, want)
		}
		created := allow && n == 0
		if allow {
			count[key] = n + cost
		}
		got, err := c.Get(ctx, wkey).Int64()
		if count[key] == 0 {
			if err != goredis.Nil {
				t.Fatalf("hit %d on %s: count %d (%v), want no key", i, key, got, err)
			}
			continue
		}
		if err != nil || got != count[key] {
			t.Fatalf("hit %d on %s (script %d): count %d (%v), want %d", i, key, via, got, err, count[key])
		}
		pttl, err := c.PTTL(ctx, wkey).Result()
		switch {
		case err != nil:
			t.Fatal(err)
		case created:
			news++
			if pttl <= 0 || pttl > time.Duration(ttl)*time.Millisecond {
				t.Fatalf("hit %d created %s with PTTL %v (script %d), want the window's TTL", i, key, pttl, via)
			}
			// The key's deadline as if its window were well under way:
			// no later hit may move it.
			if key == "mix:lost" {
				err = c.Persist(ctx, wkey).Err()
			} else {
				err = c.PExpire(ctx, wkey, time.Duration(ttl/2)*time.Millisecond).Err()
			}
			if err != nil {
				t.Fatal(err)
			}
		case key != "mix:lost" && (pttl <= 0 || pttl > time.Duration(ttl/2)*time.Millisecond):
			t.Fatalf("hit %d on %s (script %d): PTTL %v, want at most %v: a later hit moved the key's deadline", i, key, via, pttl, time.Duration(ttl/2)*time.Millisecond)
		}
		// Start a key's next window now and then: reset the count.
		if rng.IntN(20) == 0 {
			if err := c.Del(ctx, wkey).Err(); err != nil {
				t.Fatal(err)
			}
			count[key] = 0
		}
	}
	if news < 10 {
		t.Fatalf("%d keys created, want more", news)
	}
}
