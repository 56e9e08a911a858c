package redis_test

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
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

// takeLuaV1 is the take.lua of the previous release (the first batched
// one), kept to check that a rolling upgrade mixes both versions safely.
//
//go:embed testdata/take_v1.lua
var takeLuaV1 string

// takeLuaNew is the current take.lua (take/*.lua joined).
var takeLuaNew = redis.TakeLua

// tb is what the helpers need of a *testing.T or a *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// luaSeg is one segment for a direct script invocation: the ARGV layout of
// take.lua's header, built here on its own so that this test pins the
// layout independently of the Go client code.
type luaSeg struct {
	mode  string // "t" or "r"
	nowUS int64
	nonce string
	hits  []algo.Hit
}

// evalSegs runs segs as one EVAL of script with keys prefixed by prefix
// and returns the reply split into segment lines.
func evalSegs(t tb, c *goredis.Client, script, prefix string, segs []luaSeg) []string {
	t.Helper()
	var keys []string
	args := []any{len(segs)}
	for _, sg := range segs {
		args = append(args, sg.mode, sg.nowUS, sg.nonce, len(sg.hits))
		for _, h := range sg.hits {
			keys = append(keys, prefix+h.Key)
			flags := 0
			if h.Release {
				flags |= 1
			}
			if h.Soft {
				flags |= 2
			}
			if h.Charge {
				flags |= 4
			}
			l := h.Limit
			args = append(args, int(l.Kind), l.Rate, l.Period.Microseconds(), l.Burst,
				int(l.Calendar), max(l.Multiplier, 1), h.Cost, flags)
		}
	}
	r, err := c.Eval(context.Background(), script, keys, args...).Text()
	if err != nil {
		t.Fatalf("EVAL: %v", err)
	}
	lines := strings.Split(r, "\n")
	if len(lines) != len(segs) {
		t.Fatalf("reply %q: %d lines for %d segments", r, len(lines), len(segs))
	}
	return lines
}

// luaDecisions parses one segment line ("<now> (<allowed> <remaining>
// <retry> <reset> <window>)×n", durations in µs).
func luaDecisions(t tb, line string, n int) []algo.Decision {
	t.Helper()
	f := strings.Fields(line)
	if len(f) != 1+5*n {
		t.Fatalf("segment line %q: want %d fields", line, 1+5*n)
	}
	out := make([]algo.Decision, n)
	for i := range out {
		var v [5]int64
		for j := range v {
			x, err := strconv.ParseInt(f[1+5*i+j], 10, 64)
			if err != nil {
				t.Fatalf("segment line %q: %v", line, err)
			}
			v[j] = x
		}
		out[i] = algo.Decision{Allowed: v[0] == 1, Remaining: v[1], RetryAfter: time.Duration(v[2]) * time.Microsecond,
			ResetAfter: time.Duration(v[3]) * time.Microsecond, WindowAfter: time.Duration(v[4]) * time.Microsecond}
	}
	return out
}

// rawKey is a key's type and value as text (sorted sets: member=score in
// rank order) and whether it has a TTL.
func rawKey(t tb, c *goredis.Client, key string) string {
	t.Helper()
	ctx := context.Background()
	typ := c.Type(ctx, key).Val()
	var v string
	switch typ {
	case "none":
		return "none"
	case "string":
		v = c.Get(ctx, key).Val()
	case "zset":
		for _, m := range c.ZRangeWithScores(ctx, key, 0, -1).Val() {
			v += fmt.Sprintf("%v=%.0f ", m.Member, m.Score)
		}
	default:
		t.Fatalf("key %q of type %s", key, typ)
	}
	return fmt.Sprintf("%s %q ttl=%v", typ, v, c.PTTL(ctx, key).Val() > 0)
}

var compatCase atomic.Int64

// TestLuaCrossVersion: a rolling upgrade runs the previous take.lua
// (testdata/take_v1.lua) and the current one side by side on the same
// keys. For every algorithm, random schedules (pinned clocks, 1–2 segments
// per invocation, repeated keys, checks, releases, refunds) run three
// ways: on the old script only, on the new one only, and on a mix where
// each invocation picks a script at random (old writes, new reads and the
// reverse). Hits use the flags both versions know (release, soft), never
// the charge flag, and a segment with a release is never denied (the one
// behaviour in which they differ: the current script keeps a release when
// its request is denied). After every invocation the three give identical reply lines
// and identical key values, and before the first refund the decisions
// equal pkg/algo's.
func TestLuaCrossVersion(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	kinds := []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket, algo.Concurrency}
	for _, kind := range kinds {
		t.Run(kindName(algo.Limit{Kind: kind}), func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				n := compatCase.Add(1)
				names := []string{fmt.Sprintf("compat:%d:a", n), fmt.Sprintf("compat:%d:b", n)}
				limits := map[string]algo.Limit{names[0]: genLimit(rt, kind), names[1]: genLimit(rt, kind)}
				now := epoch0.Add(time.Duration(rapid.Int64Range(0, 1e12).Draw(rt, "start_us")) * time.Microsecond)
				states := map[string]algo.State{}
				checked := true // no refund yet: compare with pkg/algo
				var lastTake []luaSeg
				steps := rapid.IntRange(1, 30).Draw(rt, "steps")
				for step := range steps {
					span := stepSpan(limits[names[0]])
					if rapid.IntRange(0, 3).Draw(rt, "advance?") != 0 {
						now = now.Add(time.Duration(rapid.Int64Range(0, int64(span/time.Microsecond)/3).Draw(rt, "adv_us")) * time.Microsecond)
					}
					var segs []luaSeg
					if lastTake != nil && rapid.IntRange(0, 5).Draw(rt, "refund?") == 0 {
						// Refund the previous invocation's first segment (it
						// was allowed as a whole) at its own instant.
						sg := lastTake[0]
						sg.mode = "r"
						segs = []luaSeg{sg}
						checked = false
					} else {
						nseg := rapid.IntRange(1, 2).Draw(rt, "segments")
						for s := range nseg {
							nh := rapid.IntRange(1, 3).Draw(rt, "hits")
							hits := make([]algo.Hit, nh)
							for i := range hits {
								hits[i] = drawHit(rt, names, limits)
								if kind == algo.Concurrency && rapid.IntRange(0, 3).Draw(rt, "release?") == 0 {
									hits[i].Release = true
								}
							}
							// A release is kept when its request is denied
							// (algo.Hit.Kept), where the previous script rolled
							// it back: a segment with a release is never
							// denied here (its takes are soft), as Envoy sends
							// a release on its own at stream end.
							for i := range hits {
								if hits[i].Release {
									for j := range hits {
										hits[j].Soft = hits[j].Soft || !hits[j].Release
									}
									break
								}
							}
							segs = append(segs, luaSeg{mode: "t", nowUS: now.UnixMicro(), nonce: fmt.Sprintf("%d.%d", step, s), hits: hits})
						}
					}
					mixOld := rapid.Bool().Draw(rt, "mix_old")
					oldLines := evalSegs(rt, c, takeLuaV1, "o:", segs)
					newLines := evalSegs(rt, c, takeLuaNew, "n:", segs)
					mixScript := takeLuaNew
					if mixOld {
						mixScript = takeLuaV1
					}
					mixLines := evalSegs(rt, c, mixScript, "m:", segs)
					for s := range segs {
						if oldLines[s] != newLines[s] || oldLines[s] != mixLines[s] {
							rt.Fatalf("step %d segment %d %+v:\n old %q\n new %q\n mix %q (old: %v)", step, s, segs[s], oldLines[s], newLines[s], mixLines[s], mixOld)
						}
						if strings.HasPrefix(oldLines[s], "!") {
							rt.Fatalf("step %d segment %d: %s", step, s, oldLines[s])
						}
						if checked && segs[s].mode == "t" {
							want := algotest.Reference(states, segs[s].hits, now)
							got := luaDecisions(rt, oldLines[s], len(segs[s].hits))
							for i := range want {
								if got[i] != want[i] {
									rt.Fatalf("step %d segment %d hit %d %+v:\n lua  %+v\n algo %+v", step, s, i, segs[s].hits[i], got[i], want[i])
								}
							}
						}
					}
					for _, k := range names {
						o, nw, m := rawKey(rt, c, "o:"+k), rawKey(rt, c, "n:"+k), rawKey(rt, c, "m:"+k)
						if o != nw || o != m {
							rt.Fatalf("step %d key %s:\n old %s\n new %s\n mix %s", step, k, o, nw, m)
						}
					}
					lastTake = nil
					if segs[0].mode == "t" && allowedLine(rt, oldLines[0], segs[0].hits) {
						lastTake = segs
					}
				}
			})
		})
	}
}

// allowedLine reports whether a take segment was allowed as a whole (no
// hit that is not soft denied): only such a take is ever refunded.
func allowedLine(t tb, line string, hits []algo.Hit) bool {
	for i, d := range luaDecisions(t, line, len(hits)) {
		if !d.Allowed && !hits[i].Soft {
			return false
		}
	}
	return true
}
