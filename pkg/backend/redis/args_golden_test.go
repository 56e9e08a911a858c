package redis

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/golden"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// renderCmd prints a script invocation: the command and the script (by
// file name instead of its SHA1 or body), the KEYS, then the ARGV one
// segment per line (take.lua: the segment count first, a segment's
// header, then one line per hit).
func renderCmd(args []any) string {
	val := func(a any) string {
		switch v := a.(type) {
		case *string:
			return fmt.Sprintf("%q", *v)
		case *int64:
			return fmt.Sprint(*v)
		case string:
			return fmt.Sprintf("%q", v)
		default:
			return fmt.Sprint(v)
		}
	}
	vals := func(as []any) string {
		out := make([]string, len(as))
		for i, a := range as {
			out[i] = val(a)
		}
		return strings.Join(out, " ")
	}
	var b strings.Builder
	script := map[any]string{argSHA: "take.lua", argScript: "take.lua", argSHA1: "take1.lua", argScript1: "take1.lua"}[args[1]]
	nkeys := int(args[2].(int64))
	fmt.Fprintf(&b, "%s %s numkeys %d\nKEYS %s\n", args[0], script, nkeys, vals(args[3:3+nkeys]))
	argv := args[3+nkeys:]
	if script == "take1.lua" {
		for len(argv) > 0 {
			fmt.Fprintf(&b, "ARGV segment: %s\n", vals(argv[:fieldsSimple]))
			argv = argv[fieldsSimple:]
		}
		return b.String()
	}
	fmt.Fprintf(&b, "ARGV segments: %s\n", val(argv[0]))
	argv = argv[1:]
	for len(argv) > 0 {
		n := int(*argv[segmentHeader-1].(*int64))
		fmt.Fprintf(&b, "  segment: %s\n", vals(argv[:segmentHeader]))
		argv = argv[segmentHeader:]
		for range n {
			fmt.Fprintf(&b, "    hit: %s\n", vals(argv[:fieldsPerHit]))
			argv = argv[fieldsPerHit:]
		}
	}
	return b.String()
}

// TestScriptArgsGolden pins the KEYS/ARGV layout of both scripts (the
// protocol in take/10_args.lua and take1.lua's header) for representative
// requests: which script decides, the field order per segment and per
// hit, the flags, the units (µs), the clamped cost and the server-time
// marker "". Deployments mixing releases run each other's layout, so a
// change here is a protocol change (testdata/script_args.golden).
func TestScriptArgsGolden(t *testing.T) {
	ctx := context.Background()
	const now = 1767225600000000 // 2026-01-01T00:00:00Z in µs
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Minute}
	sw := algo.Limit{Kind: algo.SlidingWindow, Rate: 100, Period: time.Hour}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 5, Period: time.Second, Burst: 20}
	sl := algo.Limit{Kind: algo.SlidingLog, Rate: 3, Period: 10 * time.Second}
	cc := algo.Limit{Kind: algo.Concurrency, Rate: 20, Period: 30 * time.Second}
	month := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: 30 * 24 * time.Hour, Calendar: algo.CalendarMonth, Multiplier: 1}
	year2 := algo.Limit{Kind: algo.SlidingWindow, Rate: 5000, Period: 365 * 24 * time.Hour, Calendar: algo.CalendarYear, Multiplier: 2}
	seg := func(mode string, nowUS int64, nonce string, hits ...algo.Hit) *segment {
		return &segment{mode: mode, nowUS: nowUS, nonce: nonce, hits: hits}
	}
	hit := func(key string, l algo.Limit, cost int64) algo.Hit { return algo.Hit{Key: key, Limit: l, Cost: cost} }
	with := func(h algo.Hit, f func(*algo.Hit)) algo.Hit { f(&h); return h }
	cases := []struct {
		name string
		segs []*segment
	}{
		{"one fixed_window hit, server time", []*segment{seg(modeTake, -1, "n1", hit("rl:a", fw, 1))}},
		{"one token_bucket hit, pinned now, cost 3", []*segment{seg(modeTake, now, "n1", hit("rl:t", tb, 3))}},
		{"one sliding_window check (cost 0), soft", []*segment{seg(modeTake, -1, "n1", with(hit("rl:s", sw, 0), func(h *algo.Hit) { h.Soft = true }))}},
		{"three simple segments in one batch", []*segment{
			seg(modeTake, -1, "n1", hit("rl:a", fw, 1)),
			seg(modeTake, -1, "n2", hit("rl:s", sw, 2)),
			seg(modeTake, -1, "n3", hit("rl:t", tb, 1)),
		}},
		{"two hits of one request", []*segment{seg(modeTake, -1, "n1", hit("rl:a", fw, 1), hit("rl:s", sw, 1))}},
		{"release (is_negative_hits) of 2", []*segment{seg(modeTake, -1, "n1", with(hit("rl:a", fw, 2), func(h *algo.Hit) { h.Release = true }))}},
		{"always_charge and soft", []*segment{seg(modeTake, -1, "n1",
			with(hit("rl:a", fw, 1), func(h *algo.Hit) { h.Charge = true }),
			with(hit("rl:t", tb, 1), func(h *algo.Hit) { h.Charge, h.Soft = true, true }))}},
		{"sliding_log and concurrency lease", []*segment{seg(modeTake, -1, "n1", hit("rl:l", sl, 1), hit("rl:c", cc, 1))}},
		{"concurrency release", []*segment{seg(modeTake, -1, "n1", with(hit("rl:c", cc, 1), func(h *algo.Hit) { h.Release = true }))}},
		{"calendar month and 2-year sliding window", []*segment{seg(modeTake, now, "n1", hit("rl:m", month, 1), hit("rl:y", year2, 1))}},
		{"rate 0", []*segment{seg(modeTake, -1, "n1", hit("rl:z", algo.Limit{Kind: algo.FixedWindow, Period: time.Second}, 1))}},
		{"cost above 2^53 is clamped", []*segment{seg(modeTake, -1, "n1", hit("rl:a", fw, math.MaxInt64))}},
		{"refund of a take (Cluster compensation) at the take's now", []*segment{seg(modeRefund, now, "n1", hit("rl:a", fw, 1), hit("rl:l", sl, 2))}},
		{"a slot group of a request another group denied (Cluster)", []*segment{seg(modeDenied, -1, "n1", hit("rl:a", fw, 1))}},
		{"a simple and a general segment in one batch", []*segment{
			seg(modeTake, -1, "n1", hit("rl:a", fw, 1)),
			seg(modeTake, -1, "n2", hit("rl:l", sl, 1)),
		}},
	}
	var b strings.Builder
	b.WriteString(`# Script invocations as the Redis store sends them (TestScriptArgsGolden;
# go test -run TestScriptArgsGolden -update rewrites this file).
# take1.lua segment: now_us ("" = server TIME) kind rate period_us burst cost
# take.lua segment:  mode ("t" take, "r" refund, "d" denied) now_us nonce hits
#          hit:      kind rate period_us burst calendar multiplier cost flags
#                    (flags: 1 release, 2 soft, 4 always_charge)
# kind: 0 fixed_window, 1 sliding_window, 2 sliding_log, 3 token_bucket,
# 4 concurrency; calendar: 0 none, 1 month, 2 year.
`)
	for _, tc := range cases {
		args := make([]*segArgs, len(tc.segs))
		for i, sg := range tc.segs {
			args[i] = new(segArgs)
			args[i].init(sg)
		}
		fmt.Fprintf(&b, "\n## %s\n%s", tc.name, renderCmd(argsCmd(ctx, true, args).Args()))
	}
	golden.Check(t, filepath.Join("testdata", "script_args.golden"), []byte(b.String()))
}

// TestStateGolden pins what the scripts leave in Redis for representative
// requests at a pinned instant: the key (the policy key, unchanged), its
// type and its value (take/10_args.lua "Values": the string kinds'
// space-separated integers, the logs' members nonce.hit.unit with µs
// scores). Running releases read each other's keys, so a change here is a
// format change (testdata/redis_state.golden). TTLs are checked by
// TestTTLInvariant.
func TestStateGolden(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	ctx := context.Background()
	s := newInternalStore(t, srv)
	const now = 1767225630000000 // 2026-01-01T00:00:30Z in µs
	p := time.Minute
	steps := []struct {
		nonce string
		dt    int64 // µs after now
		hits  []algo.Hit
	}{
		{"n1", 0, []algo.Hit{{Key: "rl:fixed", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: p}, Cost: 3}}},
		{"n2", 0, []algo.Hit{{Key: "rl:sliding", Limit: algo.Limit{Kind: algo.SlidingWindow, Rate: 10, Period: p}, Cost: 2}}},
		{"n3", 45_000_000, []algo.Hit{{Key: "rl:sliding", Limit: algo.Limit{Kind: algo.SlidingWindow, Rate: 10, Period: p}, Cost: 1}}},
		{"n4", 0, []algo.Hit{{Key: "rl:bucket", Limit: algo.Limit{Kind: algo.TokenBucket, Rate: 3, Period: time.Second, Burst: 5}, Cost: 4}}},
		{"n5", 0, []algo.Hit{{Key: "rl:log", Limit: algo.Limit{Kind: algo.SlidingLog, Rate: 5, Period: p}, Cost: 2}}},
		{"n6", 1, []algo.Hit{
			{Key: "rl:lease", Limit: algo.Limit{Kind: algo.Concurrency, Rate: 20, Period: 30 * time.Second}, Cost: 1},
			{Key: "rl:month", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: 30 * 24 * time.Hour, Calendar: algo.CalendarMonth, Multiplier: 1}, Cost: 1},
		}},
		{"n7", 2, []algo.Hit{{Key: "rl:lease", Limit: algo.Limit{Kind: algo.Concurrency, Rate: 20, Period: 30 * time.Second}, Cost: 2}}},
	}
	for _, st := range steps {
		out := make([]algo.Decision, len(st.hits))
		if _, err := s.run(ctx, modeTake, now+st.dt, st.nonce, st.hits, out); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("# Redis state after TestStateGolden's requests: key, type, value\n# (sorted sets: member score, by score).\n")
	for _, k := range keys {
		typ := c.Type(ctx, k).Val()
		switch typ {
		case "string":
			fmt.Fprintf(&b, "%s string %q\n", k, c.Get(ctx, k).Val())
		case "zset":
			fmt.Fprintf(&b, "%s zset", k)
			for _, z := range c.ZRangeWithScores(ctx, k, 0, -1).Val() {
				fmt.Fprintf(&b, " %v %d", z.Member, int64(z.Score))
			}
			b.WriteString("\n")
		default:
			fmt.Fprintf(&b, "%s %s\n", k, typ)
		}
	}
	golden.Check(t, filepath.Join("testdata", "redis_state.golden"), []byte(b.String()))
}
