package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

var batchEpoch = time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC)

// scriptCmd is one script invocation deciding segs in order (see
// argsCmd).
func scriptCmd(ctx context.Context, sha bool, segs []*segment) *goredis.Cmd {
	as := make([]*segArgs, len(segs))
	for i, sg := range segs {
		as[i] = new(segArgs)
		as[i].init(sg)
	}
	return argsCmd(ctx, sha, as)
}

// invoke runs segs as one script invocation on c (EVAL: no script cache
// needed) and returns each segment's decisions and error.
func invoke(t testing.TB, c goredis.UniversalClient, segs []*segment) ([][]algo.Decision, []error) {
	t.Helper()
	ctx := context.Background()
	cmd := scriptCmd(ctx, false, segs)
	if err := c.Process(ctx, cmd); err != nil {
		t.Fatalf("script invocation of %d segments: %v", len(segs), err)
	}
	r, ok := cmd.Val().(string)
	if !ok {
		t.Fatalf("reply %T, want a bulk string", cmd.Val())
	}
	outs := make([][]algo.Decision, len(segs))
	errs := make([]error, len(segs))
	for i, sg := range segs {
		outs[i] = make([]algo.Decision, len(sg.hits))
		_, r, errs[i] = parseSegment(r, outs[i])
	}
	if r != "" {
		t.Fatalf("reply has %q after %d segments", r, len(segs))
	}
	return outs, errs
}

// keyState is a key's value as text (string value, or sorted set members
// with scores) and whether it has an expiry, for comparing stores.
func keyState(t testing.TB, c *goredis.Client, key string) string {
	t.Helper()
	ctx := context.Background()
	typ, err := c.Type(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	pttl := c.PTTL(ctx, key).Val()
	var v string
	switch typ {
	case "none":
		return "none"
	case "string":
		v = c.Get(ctx, key).Val()
	case "zset":
		z := c.ZRangeWithScores(ctx, key, 0, -1).Val()
		for _, m := range z {
			v += fmt.Sprintf("%v=%d ", m.Member, int64(m.Score))
		}
	default:
		t.Fatalf("key %q of type %s", key, typ)
	}
	return fmt.Sprintf("%s %q expires=%v", typ, v, pttl > 0)
}

// TestBatchMixedSegments: one invocation of segments that allow and deny,
// on the same and on different keys: each segment is all-or-nothing on
// its own (a denied one writes nothing and reports the values before it),
// segments run in order (a later one sees an earlier one's writes), and
// the decisions equal pkg/algo's reference sequence.
func TestBatchMixedSegments(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	now := batchEpoch.UnixMicro()
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Hour}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 2, Period: time.Hour}
	lg := algo.Limit{Kind: algo.SlidingLog, Rate: 2, Period: time.Hour}
	hit := func(k string, l algo.Limit, cost int64) algo.Hit { return algo.Hit{Key: k, Limit: l, Cost: cost} }
	reqs := [][]algo.Hit{
		{hit("a", fw, 1)},                  // allowed: a=1
		{hit("a", fw, 1), hit("b", tb, 3)}, // denied by b: nothing written
		{hit("a", fw, 2), hit("b", tb, 1)}, // allowed: a=3, b=1
		{hit("a", fw, 1)},                  // denied: a full
		{hit("b", tb, 1), hit("l", lg, 2)}, // allowed: b=2, l=2
		{hit("l", lg, 1), hit("b", tb, 0)}, // denied by l; b check allowed
		{hit("c", fw, 0), hit("b", tb, 1)}, // denied by b (check on c allowed)
		{hit("c", fw, 1)},                  // allowed: c=1
	}
	segs := make([]*segment, len(reqs))
	for i, h := range reqs {
		segs[i] = &segment{mode: modeTake, nowUS: now, nonce: "n" + strconv.Itoa(i), hits: h}
	}
	outs, errs := invoke(t, c, segs)
	states := map[string]algo.State{}
	wantAllowed := []bool{true, false, true, false, true, false, false, true}
	for i, h := range reqs {
		if errs[i] != nil {
			t.Fatalf("segment %d: %v", i, errs[i])
		}
		want := algotest.Reference(states, h, batchEpoch)
		if !slices.Equal(outs[i], want) {
			t.Errorf("segment %d %+v:\n redis %+v\n  algo %+v", i, h, outs[i], want)
		}
		if got := requestAllowed(h, outs[i]); got != wantAllowed[i] {
			t.Errorf("segment %d: request allowed %v, want %v", i, got, wantAllowed[i])
		}
	}
	// The same requests one invocation each give the same keys.
	for i, h := range reqs {
		sh := slices.Clone(h)
		for j := range sh {
			sh[j].Key = "seq:" + sh[j].Key
		}
		_, errs := invoke(t, c, []*segment{{mode: modeTake, nowUS: now, nonce: "n" + strconv.Itoa(i), hits: sh}})
		if errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	for _, k := range []string{"a", "b", "c", "l"} {
		if got, want := keyState(t, c, k), keyState(t, c, "seq:"+k); got != want {
			t.Errorf("key %s after one invocation: %s; after one per request: %s", k, got, want)
		}
	}
	if got := c.Get(context.Background(), "a").Val(); !strings.HasSuffix(got, " 3") {
		t.Errorf("a = %q, want count 3", got)
	}
}

// requestAllowed: no hit that is not Soft was denied.
func requestAllowed(hits []algo.Hit, out []algo.Decision) bool {
	for i, d := range out {
		if !d.Allowed && !hits[i].Soft {
			return false
		}
	}
	return true
}

// TestBatchSegmentError: a segment that fails (WRONGTYPE: its key holds a
// list) reports its own error and writes nothing; the segments before and
// after it are decided and written as usual, and the invocation succeeds.
// Malformed arguments fail the whole invocation before anything runs.
func TestBatchSegmentError(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.RPush(ctx, "list", "x").Err(); err != nil {
		t.Fatal(err)
	}
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Hour}
	now := batchEpoch.UnixMicro()
	segs := []*segment{
		{mode: modeTake, nowUS: now, nonce: "1", hits: []algo.Hit{{Key: "a", Limit: fw, Cost: 1}}},
		{mode: modeTake, nowUS: now, nonce: "2", hits: []algo.Hit{{Key: "b", Limit: fw, Cost: 1}, {Key: "list", Limit: fw, Cost: 1}}},
		{mode: modeTake, nowUS: now, nonce: "3", hits: []algo.Hit{{Key: "a", Limit: fw, Cost: 2}}},
	}
	outs, errs := invoke(t, c, segs)
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("segments 1 and 3: %v, %v", errs[0], errs[2])
	}
	if !outs[0][0].Allowed || outs[0][0].Remaining != 4 || !outs[2][0].Allowed || outs[2][0].Remaining != 2 {
		t.Errorf("segments 1 and 3: %+v %+v, want allowed with 4 then 2 remaining", outs[0], outs[2])
	}
	if !strings.HasPrefix(fmt.Sprint(errs[1]), "WRONGTYPE ") || CauseOf(errs[1]) != CauseOther {
		t.Errorf("segment 2: %v (cause %q), want a WRONGTYPE segment error", errs[1], CauseOf(errs[1]))
	}
	if n := c.Exists(ctx, "b").Val(); n != 0 {
		t.Errorf("the failed segment wrote key b")
	}
	// Malformed: a hit count beyond the arguments.
	cmd := goredis.NewCmd(ctx, "eval", takeLua, 1, "a", 1, "t", "", "n", 2, 0, 5, 3600000000, 0, 0, 1, 1, 0)
	if err := c.Process(ctx, cmd); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("malformed invocation: %v, want an error", err)
	}
	if got := c.Get(ctx, "a").Val(); !strings.HasSuffix(got, " 3") {
		t.Errorf("a = %q after a malformed invocation, want count 3 (unchanged)", got)
	}
}

// TestBatchSegmentOOM: with maxmemory exceeded (noeviction) the segments
// that would write fail with OOM, each on its own, and a segment that
// writes nothing (a check, a denial) is still decided in the same
// invocation.
func TestBatchSegmentOOM(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	ctx := context.Background()
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Hour}
	now := batchEpoch.UnixMicro()
	if _, errs := invoke(t, c, []*segment{{mode: modeTake, nowUS: now, nonce: "0", hits: []algo.Hit{{Key: "a", Limit: fw, Cost: 5}}}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	segs := []*segment{
		{mode: modeTake, nowUS: now, nonce: "1", hits: []algo.Hit{{Key: "b", Limit: fw, Cost: 1}}},
		{mode: modeTake, nowUS: now, nonce: "2", hits: []algo.Hit{{Key: "a", Limit: fw, Cost: 1}}}, // denied: full
		{mode: modeTake, nowUS: now, nonce: "3", hits: []algo.Hit{{Key: "c", Limit: fw, Cost: 0}}}, // check
		{mode: modeTake, nowUS: now, nonce: "4", hits: []algo.Hit{{Key: "d", Limit: fw, Cost: 1}}},
	}
	outs, errs := invoke(t, c, segs)
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 3} {
		if CauseOf(errs[i]) != CauseOOM {
			t.Errorf("segment %d: %v (cause %q), want OOM", i, errs[i], CauseOf(errs[i]))
		}
	}
	if errs[1] != nil || outs[1][0].Allowed || errs[2] != nil || !outs[2][0].Allowed {
		t.Errorf("denial and check: %+v %v, %+v %v", outs[1], errs[1], outs[2], errs[2])
	}
	if n := c.Exists(ctx, "b", "c", "d").Val(); n != 0 {
		t.Errorf("%d keys written under OOM", n)
	}
}

// TestBatchEqualsSequential (property): N segments in one invocation give
// the same decisions and leave the same keys as the same N segments sent
// one invocation each, in order, with the same pinned clock and nonces; for
// every algorithm, with repeated keys, checks, soft hits, releases and
// refunds of earlier segments of the same invocation.
func TestBatchEqualsSequential(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	var run int
	kinds := []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket, algo.Concurrency}
	rapid.Check(t, func(rt *rapid.T) {
		run++
		names := []string{"x", "y", "z"}
		limits := map[string]algo.Limit{}
		for _, k := range names {
			kind := kinds[rapid.IntRange(0, len(kinds)-1).Draw(rt, "kind")]
			l := algo.Limit{Kind: kind, Rate: rapid.Int64Range(0, 6).Draw(rt, "rate"),
				Period: time.Duration(rapid.Int64Range(5, 100).Draw(rt, "period_s")) * time.Second}
			if kind == algo.TokenBucket {
				l.Burst = rapid.Int64Range(0, 8).Draw(rt, "burst")
			}
			limits[k] = l
		}
		now := batchEpoch.Add(time.Duration(rapid.Int64Range(0, 1e12).Draw(rt, "start_us")) * time.Microsecond)
		n := rapid.IntRange(1, 24).Draw(rt, "segments")
		segs := make([]*segment, n)
		for i := range segs {
			now = now.Add(time.Duration(rapid.Int64Range(0, 3e6).Draw(rt, "adv_us")) * time.Microsecond)
			sg := &segment{mode: modeTake, nowUS: now.UnixMicro(), nonce: "n" + strconv.Itoa(i)}
			if i > 0 && rapid.IntRange(0, 5).Draw(rt, "refund?") == 0 {
				// refund an earlier segment (as Cluster compensation does)
				p := segs[rapid.IntRange(0, i-1).Draw(rt, "of")]
				if p.mode == modeTake {
					*sg = segment{mode: modeRefund, nowUS: p.nowUS, nonce: p.nonce, hits: p.hits}
					segs[i] = sg
					continue
				}
			}
			nh := rapid.IntRange(1, 3).Draw(rt, "hits")
			for range nh {
				k := names[rapid.IntRange(0, len(names)-1).Draw(rt, "key")]
				l := limits[k]
				h := algo.Hit{Key: k, Limit: l, Cost: rapid.Int64Range(0, l.Rate+2).Draw(rt, "cost")}
				h.Soft = rapid.IntRange(0, 4).Draw(rt, "soft?") == 0
				h.Release = l.Kind == algo.Concurrency && rapid.IntRange(0, 3).Draw(rt, "release?") == 0
				sg.hits = append(sg.hits, h)
			}
			segs[i] = sg
		}
		prefix := func(p string) []*segment {
			out := make([]*segment, n)
			for i, sg := range segs {
				s2 := *sg
				s2.hits = slices.Clone(sg.hits)
				for j := range s2.hits {
					s2.hits[j].Key = fmt.Sprintf("%s:%d:%s", p, run, s2.hits[j].Key)
				}
				out[i] = &s2
			}
			return out
		}
		batched, seq := prefix("b"), prefix("s")
		gotB, errB := invoke(t, c, batched)
		for i := range n {
			gotS, errS := invoke(t, c, seq[i:i+1])
			if errB[i] != nil || errS[0] != nil {
				rt.Fatalf("segment %d: %v / %v", i, errB[i], errS[0])
			}
			if !slices.Equal(gotB[i], gotS[0]) {
				rt.Fatalf("segment %d %s %+v:\n one invocation %+v\n one per segment %+v", i, segs[i].mode, segs[i].hits, gotB[i], gotS[0])
			}
		}
		for _, k := range names {
			b, s := keyState(t, c, fmt.Sprintf("b:%d:%s", run, k)), keyState(t, c, fmt.Sprintf("s:%d:%s", run, k))
			if b != s {
				rt.Fatalf("key %s: one invocation %s, one per segment %s", k, b, s)
			}
		}
	})
}

// TestConcurrentCallsShareInvocation: calls queued while a flush is in
// flight go out together as ONE script invocation: with one flush loop
// and Redis frozen (SIGSTOP) under a first call, 50 concurrent calls queue
// up; after SIGCONT Redis counts 2 EVALSHA for the 51 calls, and every
// decision is exact (40 of 51 allowed on a 40-per-hour key).
func TestConcurrentCallsShareInvocation(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 5 * time.Second
	o.Pipelines = 1
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 40, Period: time.Hour}
	if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "warm", Limit: l, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	ctl := srv.Client()
	if err := ctl.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	t.Cleanup(func() {
		if srv.Alive() {
			srv.Cont()
		}
	})
	var mu sync.Mutex
	allowed := 0
	var wg sync.WaitGroup
	take := func() {
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: "shared", Limit: l, Cost: 1}})
		if err != nil {
			t.Error(err)
			return
		}
		if d[0].Allowed {
			mu.Lock()
			allowed++
			mu.Unlock()
		}
	}
	wg.Go(take)
	waitQueued := func(n int) {
		t.Helper()
		for start := time.Now(); ; time.Sleep(time.Millisecond) {
			s.batch.mu.Lock()
			q, f := len(s.batch.queue), s.batch.inFlight
			s.batch.mu.Unlock()
			if q == n && f == 1 {
				return
			}
			if time.Since(start) > 20*time.Second {
				t.Fatalf("queue %d, flushes %d; want %d queued behind 1", q, f, n)
			}
		}
	}
	waitQueued(0) // the first call is in flight, the queue is empty
	for range 50 {
		wg.Go(take)
	}
	waitQueued(50)
	srv.Cont()
	wg.Wait()
	if allowed != 40 {
		t.Errorf("%d of 51 allowed on a 40-per-hour key, want 40", allowed)
	}
	info, err := ctl.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if calls := commandCalls(t, info, "evalsha"); calls != 2 {
		t.Errorf("cmdstat_evalsha calls = %d for 51 calls (1 in flight, 50 queued), want 2\n%s", calls, info)
	}
}

// commandCalls is the calls count of cmdstat_<cmd> in INFO commandstats
// (0 when absent).
func commandCalls(t testing.TB, info, cmd string) int {
	t.Helper()
	for line := range strings.SplitSeq(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v[:strings.IndexByte(v, ',')])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return 0
}

// TestClusterBatchBySlot: on Cluster a flush sends one invocation per hash
// slot (several in one pipeline), never one across slots (no CROSSSLOT),
// keeping each slot's calls in order: 12 calls over 3 slots on 3 masters
// cost 3 EVALSHA in all, and the decisions are exact.
func TestClusterBatchBySlot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	g := redistest.Cluster(t, 3)
	o := DefaultOptions()
	o.Mode, o.URL, o.Addrs = Cluster, "", g.Addrs()
	o.Timeout, o.DialTimeout = 2*time.Second, 2*time.Second
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	// Keys in 3 slots on 3 different masters.
	var keys []string
	thirds := map[uint16]bool{}
	for i := 0; len(keys) < 3; i++ {
		k := "slot" + strconv.Itoa(i)
		if th := Slot(k) / 5462; !thirds[th] {
			thirds[th] = true
			keys = append(keys, k)
		}
	}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Hour}
	if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: keys[0], Limit: l, Cost: 0}}); err != nil { // load the script
		t.Fatal(err)
	}
	cc := g.Client()
	t.Cleanup(func() { _ = cc.Close() })
	resetStats := func() {
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			for _, src := range []string{takeLua, take1Lua} { // both scripts, as Warm loads them
				if err := c.ScriptLoad(ctx, src).Err(); err != nil {
					return err
				}
			}
			return c.ConfigResetStat(ctx).Err()
		}); err != nil {
			t.Fatal(err)
		}
	}
	resetStats()
	var batch []*scriptCall
	for i := range 12 {
		k := keys[i%3]
		c := newCall(ctx, &segment{mode: modeTake, nowUS: -1, nonce: "c" + strconv.Itoa(i),
			hits: []algo.Hit{{Key: k, Limit: l, Cost: 1}}}, make([]algo.Decision, 1))
		c.slot = Slot(k)
		c.deadline = s.batch.budget(ctx, s.batch.clock())
		batch = append(batch, c)
	}
	calls := slices.Clone(batch)
	s.batch.exec(0, batch)
	for i, c := range calls {
		<-c.done
		if c.err != nil {
			t.Fatalf("call %d: %v", i, c.err)
		}
		// per key: calls 0..3 in order; the first 3 are allowed
		nth := i / 3
		if want := nth < 3; c.out[0].Allowed != want || (want && c.out[0].Remaining != int64(2-nth)) {
			t.Errorf("call %d (key %s, #%d): %+v, want allowed %v", i, c.args.keys[0], nth, c.out[0], want)
		}
	}
	var mu sync.Mutex
	var perNode []int
	total := 0
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		n := commandCalls(t, info, "evalsha")
		mu.Lock()
		total += n
		perNode = append(perNode, n)
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if total != 3 {
		t.Errorf("%d EVALSHA (per master %v) for 12 calls on 3 slots, want 3", total, perNode)
	}
}

// BenchmarkInvocation measures Redis' own time for one script invocation
// of n one-hit fixed_window segments on distinct keys (server clock), from
// INFO commandstats: redis_us/invocation is how long one batch holds Redis
// (a script blocks it), redis_us/segment the cost per decision.
//
//	go test ./pkg/backend/redis -run '^$' -bench Invocation
func BenchmarkInvocation(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client()
	ctx := context.Background()
	if err := c.ScriptLoad(ctx, takeLua).Err(); err != nil {
		b.Fatal(err)
	}
	for _, kind := range []algo.Kind{algo.FixedWindow, algo.TokenBucket, algo.SlidingLog} {
		for _, n := range []int{1, 16, 64, 256} {
			b.Run(fmt.Sprintf("%s/segments=%d", [...]string{"fixed_window", "sliding_window", "sliding_log", "token_bucket"}[kind], n), func(b *testing.B) {
				l := algo.Limit{Kind: kind, Rate: 1 << 20, Period: time.Second}
				segs := make([]*segment, n)
				for i := range segs {
					segs[i] = &segment{mode: modeTake, nowUS: -1, nonce: "n" + strconv.Itoa(i),
						hits: []algo.Hit{{Key: fmt.Sprintf("inv:%d:%d:%d", kind, n, i), Limit: l, Cost: 1}}}
				}
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for range b.N {
					if err := c.Process(ctx, scriptCmd(ctx, true, segs)); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				info := c.Info(ctx, "commandstats").Val()
				var usec float64
				for line := range strings.SplitSeq(info, "\n") {
					if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
						for kv := range strings.SplitSeq(v, ",") {
							if x, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
								usec, _ = strconv.ParseFloat(x, 64)
							}
						}
					}
				}
				b.ReportMetric(usec, "redis_us/invocation")
				b.ReportMetric(usec/float64(n), "redis_us/segment")
			})
		}
	}
}

// TestCallTimeoutError: the sweeper's error is a timeout outage
// (CauseTimeout, errors.Is context.DeadlineExceeded), so the breaker and
// the failure modes treat it like a go-redis read timeout.
func TestCallTimeoutError(t *testing.T) {
	if got := CauseOf(ErrCallTimeout); got != CauseTimeout {
		t.Errorf("CauseOf(ErrCallTimeout) = %q, want %q", got, CauseTimeout)
	}
	if !errors.Is(ErrCallTimeout, context.DeadlineExceeded) {
		t.Error("ErrCallTimeout does not wrap context.DeadlineExceeded")
	}
	if !isOutage(ErrCallTimeout) {
		t.Error("ErrCallTimeout is not an outage")
	}
	for _, tc := range []struct{ timeout, want time.Duration }{
		{10 * time.Millisecond, time.Millisecond},
		{20 * time.Millisecond, time.Millisecond},
		{5 * time.Millisecond, 500 * time.Microsecond},
		{100 * time.Microsecond, 100 * time.Microsecond},
	} {
		if got := sweepTick(tc.timeout); got != tc.want {
			t.Errorf("sweepTick(%v) = %v, want %v", tc.timeout, got, tc.want)
		}
	}
}

// TestSegArgsCopiesHits: a call's arguments are copied from its hits when
// it is queued, so a caller that reuses its hits after leaving at its
// deadline cannot change what a flush sends.
func TestSegArgsCopiesHits(t *testing.T) {
	l := algo.Limit{Kind: algo.TokenBucket, Rate: 1000, Period: time.Minute, Burst: 300}
	hits := []algo.Hit{{Key: "a", Limit: l, Cost: 2, Soft: true}, {Key: "b", Limit: l, Cost: 1, Release: true}}
	for _, n := range []int{1, 2} {
		var a segArgs
		a.init(&segment{mode: modeRefund, nowUS: 1234, nonce: "n1", hits: hits[:n]})
		want := cmdArgs(argsCmd(context.Background(), true, []*segArgs{&a}))
		for i := range hits {
			hits[i] = algo.Hit{Key: "changed", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 7, Period: time.Second}}
		}
		got := cmdArgs(argsCmd(context.Background(), true, []*segArgs{&a}))
		if !slices.Equal(got, want) {
			t.Errorf("%d hits: args after the hits changed %v, want %v", n, got, want)
		}
		wantTail := []string{"1", "r", "1234", "n1", strconv.Itoa(n)}
		if k := 3 + n; !slices.Equal(got[k:k+5], wantTail) || got[3] != "a" || got[2] != strconv.Itoa(n) {
			t.Errorf("%d hits: args %v, want keys from a and ARGV starting %v", n, got, wantTail)
		}
		hits = []algo.Hit{{Key: "a", Limit: l, Cost: 2, Soft: true}, {Key: "b", Limit: l, Cost: 1, Release: true}}
	}
}

// cmdArgs is cmd's arguments as go-redis writes them (pointers
// dereferenced), formatted.
func cmdArgs(cmd *goredis.Cmd) []string {
	var out []string
	for _, a := range cmd.Args() {
		switch v := a.(type) {
		case *string:
			a = *v
		case *int64:
			a = *v
		}
		out = append(out, fmt.Sprint(a))
	}
	return out
}
