package redis

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"math/rand/v2"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestSlotMatchesServer compares Slot with CLUSTER KEYSLOT on a
// cluster-enabled redis-server, for keys with and without hash tags.
func TestSlotMatchesServer(t *testing.T) {
	srv := redistest.Standalone(t, redistest.WithArgs("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"))
	c := srv.Client()
	ctx := context.Background()
	keys := []string{"", "a", "foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}", "}{", "{a", "rl:\x00\xff{x}", "123456789"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = "ab{}:\x00\xfe"[r.IntN(7)]
		}
		keys = append(keys, string(b))
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT = %d", k, got, want)
		}
	}
	if got := crc16("123456789"); got != 0x31C3 { // the spec's check value
		t.Errorf("crc16 check value %#x, want 0x31c3", got)
	}
}

// newInternalStore is a Store on srv with default options (the server's
// clock) and a 2 s timeout, closed at the end of the test.
func newInternalStore(t *testing.T, srv *redistest.Server) *Store {
	t.Helper()
	return newInternalStoreOpts(t, srv, func(o *Options) { o.WindowKeys = false })
}

// newInternalStoreOpts is newInternalStore with the defaults, changed by
// set.
func newInternalStoreOpts(t *testing.T, srv *redistest.Server, set func(*Options)) *Store {
	t.Helper()
	o := DefaultOptions()
	set(&o)
	o.URL, o.Timeout = srv.URL(), 2*time.Second
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestTTLInvariant: with the server's clock, every key written has an
// expiry at or after the instant its state is empty again (script now +
// ResetAfter, compared with PEXPIRETIME), and no key lives without one:
// takes, always_charge takes (denied ones write too) and refunds.
func TestTTLInvariant(t *testing.T) {
	for _, wk := range []bool{false, true} {
		t.Run(fmt.Sprintf("window_keys=%v", wk), func(t *testing.T) { ttlInvariant(t, wk) })
	}
}

// ttlInvariant is TestTTLInvariant with Options.WindowKeys wk: a fixed or
// sliding window's key is then its newest window key, a token bucket's its
// lean key.
func ttlInvariant(t *testing.T, wk bool) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	c := srv.Client()
	s := newInternalStoreOpts(t, srv, func(o *Options) { o.WindowKeys = wk })
	p := 3 * time.Second
	limits := []algo.Limit{
		{Kind: algo.FixedWindow, Rate: 3, Period: p},
		{Kind: algo.SlidingWindow, Rate: 3, Period: p},
		{Kind: algo.SlidingLog, Rate: 3, Period: p},
		{Kind: algo.TokenBucket, Rate: 3, Period: p + 7*time.Microsecond, Burst: 5},
		{Kind: algo.Concurrency, Rate: 3, Period: p},
		{Kind: algo.FixedWindow, Rate: 3, Calendar: algo.CalendarMonth, Multiplier: 1, Period: 30 * 24 * time.Hour},
		{Kind: algo.SlidingWindow, Rate: 3, Calendar: algo.CalendarYear, Multiplier: 2, Period: 365 * 24 * time.Hour},
	}
	written := 0
	for i, l := range limits {
		for j := range 3 {
			key := fmt.Sprintf("ttl:%d:%d", i, j)
			for n := range 4 {
				h := []algo.Hit{{Key: key, Limit: l, Cost: int64(n%2 + 1), Charge: j == 1, Release: j == 2 && n == 3}}
				out := make([]algo.Decision, 1)
				nowUS, err := s.run(ctx, modeTake, -1, s.nonce(), h, out)
				if err != nil {
					t.Fatal(err)
				}
				if !out[0].Allowed && !h[0].Kept() {
					continue
				}
				written++
				stored := key
				if wk && (windowKind(&h[0]) || leanKind(&h[0])) {
					pattern := "{" + key + "}:v2:*" // window.lua's keys
					switch {
					case leanKind(&h[0]) && l.Kind == algo.SlidingWindow:
						pattern = "{" + key + "}:v2s:*" // lean.lua's, one per window
					case leanKind(&h[0]):
						pattern = "{" + key + "}:v2g" // lean.lua's token bucket
					}
					ks, err := c.Keys(ctx, pattern).Result()
					if err != nil {
						t.Fatal(err)
					}
					slices.Sort(ks)
					stored = key + ":none"
					if len(ks) > 0 {
						stored = ks[len(ks)-1]
					}
				}
				at, err := c.PExpireTime(ctx, stored).Result()
				if err != nil {
					t.Fatal(err)
				}
				need := nowUS + out[0].ResetAfter.Microseconds()
				if at == -2 { // no such key (-1 would be: no expiry)
					// A fixed window written just before its end has a TTL of
					// a few ms, so it can expire before this check. That is
					// only right once the server's clock has reached need.
					tm, err := c.Time(ctx).Result()
					if err != nil {
						t.Fatal(err)
					}
					if tm.UnixMicro() < need {
						t.Errorf("%s %+v: gone at %d µs, state empty only at %d µs", key, l, tm.UnixMicro(), need)
					}
					continue
				}
				if at.Microseconds() < need {
					t.Errorf("%s %+v: expires at %d µs, state empty only at %d µs", key, l, at.Microseconds(), need)
				}
			}
		}
	}
	if written == 0 {
		t.Fatal("nothing written")
	}
	iter := c.Scan(ctx, 0, "*", 100).Iterator()
	n := 0
	for iter.Next(ctx) {
		n++
		pttl, err := c.PTTL(ctx, iter.Val()).Result()
		if err != nil {
			t.Fatal(err)
		}
		// -2: expired between SCAN and PTTL (a fixed window's key lives
		// only to the window's end); -1: no expiry, which is the bug.
		if pttl != -2 && pttl <= 0 {
			t.Errorf("key %q has PTTL %v: every key must expire", iter.Val(), pttl)
		}
	}
	if err := iter.Err(); err != nil || n == 0 {
		t.Fatalf("scan: %d keys, %v", n, err)
	}
}

// TestArgsAllocs: building a script invocation allocates its argument
// slice and the command only (2 allocations), for take1.lua (16 simple
// segments) as for take.lua (16 two-hit segments); the segments' own
// arguments were copied when they were queued.
func TestArgsAllocs(t *testing.T) {
	ctx := context.Background()
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Second}
	mk := func(hits []algo.Hit) []*segArgs {
		segs := make([]*segArgs, 16)
		for i := range segs {
			segs[i] = new(segArgs)
			segs[i].init(&segment{mode: modeTake, nowUS: -1, nonce: "n", hits: hits})
		}
		return segs
	}
	simple := mk([]algo.Hit{{Key: "a", Limit: fw, Cost: 1}})
	general := mk([]algo.Hit{{Key: "a", Limit: fw, Cost: 1}, {Key: "b", Limit: fw, Cost: 1}})
	if !simple[0].simple || general[0].simple {
		t.Fatalf("simple: %v and %v, want true and false", simple[0].simple, general[0].simple)
	}
	for name, segs := range map[string][]*segArgs{"take1.lua": simple, "take.lua": general} {
		if n := testing.AllocsPerRun(100, func() { _ = argsCmd(ctx, true, segs) }); n > 2 {
			t.Errorf("%s: %v allocations per invocation, want at most 2", name, n)
		}
	}
}
