package redis_test

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

//go:embed take1.lua
var takeLua1 string

// evalSimple runs segs (each one hit) as one EVAL of take1.lua with keys
// prefixed by prefix (ARGV per segment: now, kind, rate, period_us,
// burst, cost) and returns the reply split into segment lines.
func evalSimple(t tb, c *goredis.Client, prefix string, segs []luaSeg) []string {
	t.Helper()
	var keys []string
	var args []any
	for _, sg := range segs {
		h := sg.hits[0]
		keys = append(keys, prefix+h.Key)
		l := h.Limit
		args = append(args, sg.nowUS, int(l.Kind), l.Rate, l.Period.Microseconds(), l.Burst, h.Cost)
	}
	r, err := c.Eval(context.Background(), takeLua1, keys, args...).Text()
	if err != nil {
		t.Fatalf("EVAL take1.lua: %v", err)
	}
	lines := strings.Split(r, "\n")
	if len(lines) != len(segs) {
		t.Fatalf("reply %q: %d lines for %d segments", r, len(lines), len(segs))
	}
	return lines
}

var fastCase atomic.Int64

// TestFastPathAgrees: take1.lua (the fast path) and take.lua give
// identical reply lines, values and TTLs for every input the Store sends
// to take1.lua: random schedules (pinned clocks that also go back, 1–4
// segments per invocation on two keys, so later segments read earlier
// ones' writes, checks, costs above capacity, soft hits) of
// fixed_window, sliding_window and token_bucket, and a segment on a key
// of another type (WRONGTYPE, that segment only). Each script runs on its
// own copy of the keys, which must stay byte for byte equal; the expiry
// instants (PEXPIRETIME) may differ only by the real time between the two
// invocations (plus 10 ms of Redis' cached clock). With TestAgreement (Store vs pkg/algo, which routes every
// one-hit take through take1.lua) this closes the loop Lua vs Go.
func TestFastPathAgrees(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	kinds := []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.TokenBucket}
	rapid.Check(t, func(rt *rapid.T) {
		n := fastCase.Add(1)
		names := []string{fmt.Sprintf("fp:%d:a", n), fmt.Sprintf("fp:%d:b", n), fmt.Sprintf("fp:%d:z", n)}
		limits := map[string]algo.Limit{}
		for _, k := range names[:2] {
			l := genLimit(rt, kinds[rapid.IntRange(0, len(kinds)-1).Draw(rt, "kind")])
			l.Calendar, l.Multiplier = algo.CalendarNone, 0
			if l.Period > 200*time.Second {
				l.Period = time.Duration(rapid.Int64Range(5, 120).Draw(rt, "period2_s")) * time.Second
			}
			l.Rate = max(l.Rate, 1) // take1.lua: rate >= 1 (the Store sends rate 0 to take.lua)
			if l.Kind != algo.TokenBucket {
				l.Burst = rapid.Int64Range(-3, 15).Draw(rt, "burst_other")
			}
			limits[k] = l
		}
		limits[names[2]] = limits[names[0]]
		for _, p := range []string{"g:", "f:"} {
			if err := c.ZAdd(ctx, p+names[2], goredis.Z{Score: 1, Member: "m"}).Err(); err != nil {
				rt.Fatalf("ZADD: %v", err)
			}
		}
		now := epoch0.UnixMicro() + rapid.Int64Range(0, 1e12).Draw(rt, "start_us")
		steps := rapid.IntRange(1, 30).Draw(rt, "steps")
		var apart int64 // ms, see slack
		for step := range steps {
			span := limits[names[0]].Period.Microseconds()
			switch rapid.IntRange(0, 9).Draw(rt, "advance_kind") {
			case 0:
			case 1:
				now -= rapid.Int64Range(1, 2_000_000).Draw(rt, "back_us")
			case 2:
				now += rapid.Int64Range(0, 3*span).Draw(rt, "idle_us")
			default:
				now += rapid.Int64Range(0, span/4).Draw(rt, "adv_us")
			}
			segs := make([]luaSeg, rapid.IntRange(1, 4).Draw(rt, "segments"))
			for i := range segs {
				k := names[0]
				switch rapid.IntRange(0, 9).Draw(rt, "key") {
				case 0:
					k = names[2]
				case 1, 2, 3, 4:
					k = names[1]
				}
				l := limits[k]
				h := algo.Hit{Key: k, Limit: l, Cost: rapid.Int64Range(0, l.Rate+max(l.Burst, 0)+2).Draw(rt, "cost")}
				if rapid.IntRange(0, 19).Draw(rt, "max_cost?") == 0 {
					h.Cost = algo.MaxCost
				}
				h.Soft = rapid.IntRange(0, 4).Draw(rt, "soft?") == 0
				segs[i] = luaSeg{mode: "t", nowUS: now + rapid.Int64Range(0, 2).Draw(rt, "skew_us"), nonce: fmt.Sprintf("n%d.%d", step, i), hits: []algo.Hit{h}}
			}
			t0, err := c.Time(ctx).Result()
			if err != nil {
				rt.Fatalf("TIME: %v", err)
			}
			want := evalSegs(rt, c, takeLuaNew, "g:", segs)
			got := evalSimple(rt, c, "f:", segs)
			t1, err := c.Time(ctx).Result()
			if err != nil {
				rt.Fatalf("TIME: %v", err)
			}
			for i := range segs {
				if got[i] != want[i] {
					rt.Fatalf("step %d, segment %d %+v:\n take1.lua %q\n  take.lua %q", step, i, segs[i].hits[0], got[i], want[i])
				}
			}
			// A key may have been written at an earlier step: the slack is
			// the longest time between the two invocations of any step so
			// far, plus 10 ms of Redis' cached command time, far below any
			// difference a wrong expiry instant makes (a window, the
			// pinned clock's 1 s).
			apart = max(apart, t1.Sub(t0).Milliseconds())
			slack := apart + 10
			for _, k := range names[:2] {
				g, f := rawKey(rt, c, "g:"+k), rawKey(rt, c, "f:"+k)
				if g != f {
					rt.Fatalf("step %d: key %s: take1.lua left %s, take.lua %s", step, k, f, g)
				}
				eg, ef := c.PExpireTime(ctx, "g:"+k).Val().Milliseconds(), c.PExpireTime(ctx, "f:"+k).Val().Milliseconds()
				if d := ef - eg; d < -slack || d > slack {
					rt.Fatalf("step %d: key %s expires at %v (take1.lua) vs %v (take.lua): %d ms apart, at most %d ms between the calls",
						step, k, ef, eg, d, slack-10)
				}
			}
		}
	})
}

// TestFastPathSelected: the Store sends a one-hit take of a string kind
// to take1.lua and everything else (a release, a charge, a calendar
// window, two hits, a sliding log, rate 0) to take.lua. After SCRIPT
// FLUSH the first call of each kind sends its script with EVAL (which
// caches it), so SCRIPT EXISTS tells which script decided.
func TestFastPathSelected(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	s := newTestStore(t, srv, nil, 0)
	sha := func(src string) string { h := sha1.Sum([]byte(src)); return hex.EncodeToString(h[:]) }
	general, fast := redis.ScriptSHA(), sha(takeLua1)
	if fast != redis.FastScriptSHA() {
		t.Fatalf("FastScriptSHA %s, SHA1 of take1.lua %s", redis.FastScriptSHA(), fast)
	}
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}
	cases := []struct {
		name   string
		hits   []algo.Hit
		simple bool
	}{
		{"fixed_window", []algo.Hit{{Key: "sel:1", Limit: fw, Cost: 1}}, true},
		{"sliding_window soft", []algo.Hit{{Key: "sel:2", Limit: algo.Limit{Kind: algo.SlidingWindow, Rate: 5, Period: time.Minute}, Cost: 1, Soft: true}}, true},
		{"token_bucket", []algo.Hit{{Key: "sel:3", Limit: algo.Limit{Kind: algo.TokenBucket, Rate: 5, Period: time.Minute, Burst: 2}, Cost: 1}}, true},
		{"release", []algo.Hit{{Key: "sel:1", Limit: fw, Cost: 1, Release: true}}, false},
		{"charge", []algo.Hit{{Key: "sel:1", Limit: fw, Cost: 1, Charge: true}}, false},
		{"calendar", []algo.Hit{{Key: "sel:4", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: 30 * 24 * time.Hour, Calendar: algo.CalendarMonth, Multiplier: 1}, Cost: 1}}, false},
		{"two hits", []algo.Hit{{Key: "sel:1", Limit: fw, Cost: 1}, {Key: "sel:5", Limit: fw, Cost: 1}}, false},
		{"sliding_log", []algo.Hit{{Key: "sel:6", Limit: algo.Limit{Kind: algo.SlidingLog, Rate: 5, Period: time.Minute}, Cost: 1}}, false},
		{"rate 0", []algo.Hit{{Key: "sel:7", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 0, Period: time.Minute}, Cost: 1}}, false},
	}
	for _, tc := range cases {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := algotest.Take(ctx, s, tc.hits); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		ex, err := c.ScriptExists(ctx, general, fast).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ex[1] != tc.simple || ex[0] == tc.simple {
			t.Errorf("%s: SCRIPT EXISTS take.lua %v, take1.lua %v; want take1.lua only = %v", tc.name, ex[0], ex[1], tc.simple)
		}
	}
}

var pathCase atomic.Int64

// TestSegmentPathsAgree: take.lua's two decision paths, the direct one
// (take/80_fast_segment.lua: a take of string kinds on distinct keys) and
// the general one (take/70_segment.lua), give identical decisions, values
// and expiries for every request the direct path decides, over random
// schedules of 1–3 hits of mixed kinds and flags (clocks that also go
// back). Each request runs on its own copy of the keys through the general
// path, forced by one more hit that changes nothing: a soft check of an
// empty sliding log. With TestFastPathAgrees and TestAgreement every Lua
// path is tied to the others.
func TestSegmentPathsAgree(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	kinds := []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.TokenBucket}
	logCheck := algo.Hit{Limit: algo.Limit{Kind: algo.SlidingLog, Rate: 1, Period: time.Second}, Soft: true}
	rapid.Check(t, func(rt *rapid.T) {
		n := pathCase.Add(1)
		names := []string{fmt.Sprintf("sp:%d:a", n), fmt.Sprintf("sp:%d:b", n), fmt.Sprintf("sp:%d:c", n)}
		limits := map[string]algo.Limit{}
		for _, k := range names {
			limits[k] = genLimit(rt, kinds[rapid.IntRange(0, len(kinds)-1).Draw(rt, "kind")])
		}
		logCheck.Key = fmt.Sprintf("sp:%d:log", n)
		now := epoch0.UnixMicro() + rapid.Int64Range(0, 1e12).Draw(rt, "start_us")
		var apart int64 // ms, as in TestFastPathAgrees
		for step := range rapid.IntRange(1, 30).Draw(rt, "steps") {
			switch rapid.IntRange(0, 9).Draw(rt, "advance_kind") {
			case 0:
			case 1:
				now -= rapid.Int64Range(1, 2_000_000).Draw(rt, "back_us")
			case 2:
				now += rapid.Int64Range(0, 3*limits[names[0]].Period.Microseconds()).Draw(rt, "idle_us")
			default:
				now += rapid.Int64Range(0, limits[names[0]].Period.Microseconds()/4).Draw(rt, "adv_us")
			}
			keys := rapid.Permutation(names).Draw(rt, "keys")[:rapid.IntRange(1, 3).Draw(rt, "hits")]
			hits := make([]algo.Hit, len(keys))
			for i, k := range keys {
				l := limits[k]
				h := algo.Hit{Key: k, Limit: l, Cost: rapid.Int64Range(0, l.Rate+l.Burst+2).Draw(rt, "cost")}
				if rapid.IntRange(0, 19).Draw(rt, "max_cost?") == 0 {
					h.Cost = algo.MaxCost
				}
				h.Soft = rapid.IntRange(0, 4).Draw(rt, "soft?") == 0
				h.Charge = rapid.IntRange(0, 3).Draw(rt, "charge?") == 0
				h.Release = rapid.IntRange(0, 4).Draw(rt, "release?") == 0
				hits[i] = h
			}
			nonce := fmt.Sprintf("n%d", step)
			t0 := c.Time(ctx).Val()
			direct := evalSegs(rt, c, takeLuaNew, "d:", []luaSeg{{mode: "t", nowUS: now, nonce: nonce, hits: hits}})[0]
			general := evalSegs(rt, c, takeLuaNew, "g:", []luaSeg{{mode: "t", nowUS: now, nonce: nonce, hits: append(slices.Clone(hits), logCheck)}})[0]
			apart = max(apart, c.Time(ctx).Val().Sub(t0).Milliseconds())
			if !strings.HasPrefix(general, direct+" ") || strings.Count(general, " ") != strings.Count(direct, " ")+5 {
				rt.Fatalf("step %d at %d, hits %+v:\n  direct %q\n general %q (+ the log check)", step, now, hits, direct, general)
			}
			if d := luaDecisions(rt, general, len(hits)+1)[len(hits)]; !d.Allowed {
				rt.Fatalf("step %d: the added log check was denied: %+v", step, d)
			}
			slack := apart + 10
			for _, k := range names {
				dv, gv := rawKey(rt, c, "d:"+k), rawKey(rt, c, "g:"+k)
				if dv != gv {
					rt.Fatalf("step %d: key %s: direct path left %s, general path %s", step, k, dv, gv)
				}
				ed, eg := c.PExpireTime(ctx, "d:"+k).Val().Milliseconds(), c.PExpireTime(ctx, "g:"+k).Val().Milliseconds()
				if d := ed - eg; d < -slack || d > slack {
					rt.Fatalf("step %d: key %s expires at %v (direct) vs %v (general): %d ms apart", step, k, ed, eg, d)
				}
			}
			if v := rawKey(rt, c, "g:"+logCheck.Key); v != "none" {
				rt.Fatalf("step %d: the log check wrote %s", step, v)
			}
		}
	})
}
