package redis_test

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

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// frozenStore is a Store on a Redis that is frozen (SIGSTOP) once one
// Take has warmed it; breakerOff disables the circuit breaker, so that
// every Take reaches the batcher. srv is thawed at the end of the test.
func frozenStore(t testing.TB, breakerOff bool) (*redis.Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Breaker.Disabled = breakerOff
	s := openStore(t, o)
	if _, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "warm", Limit: frozenLimit, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	t.Cleanup(func() {
		if srv.Alive() {
			srv.Cont()
		}
	})
	return s, srv
}

var frozenLimit = algo.Limit{Kind: algo.TokenBucket, Rate: 100, Period: time.Second}

// frozenTakes runs callers goroutines of per Takes each on s, each Take
// with deadline (0: none), and checks that every one fails with cause
// (shed or decided by the rules' failure modes, never counted by a
// frozen Redis). It returns how long each took, sorted.
func frozenTakes(t testing.TB, s *redis.Store, deadline time.Duration, callers, per int, cause string) []time.Duration {
	t.Helper()
	var mu sync.Mutex
	var took []time.Duration
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range per {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if deadline > 0 {
					ctx, cancel = context.WithTimeout(ctx, deadline)
				}
				t0 := time.Now()
				_, err := algotest.Take(ctx, s, []algo.Hit{{Key: "k" + strconv.Itoa(g*per+i), Limit: frozenLimit, Cost: 1}})
				d := time.Since(t0)
				cancel()
				if redis.CauseOf(err) != cause {
					t.Errorf("deadline %v, Redis frozen: Take: %v (cause %q), want cause %q", deadline, err, redis.CauseOf(err), cause)
				}
				mu.Lock()
				took = append(took, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(took)
	return took
}

// TestTakeWithinDeadlineRedisFrozen: with Redis frozen (SIGSTOP), 40
// concurrent callers each make 3 Takes with an Envoy-like deadline, in
// flight or queued behind a stuck invocation, and every one returns. With
// a 20 ms deadline a request has been pending for a Timeout (10 ms) by
// the end of the budget and Redis has sent nothing since, so the error is
// a timeout (the rules' failure modes decide); the 5 ms round follows
// while Redis is still frozen, so it is a timeout too (a 5 ms budget on a
// fresh stall is a deadline: TestLivenessStallIsPerSocketAndKernelBased).
// The breaker is disabled so that every Take reaches the batcher. After
// SIGCONT, Takes succeed again. How far past its deadline a Take returns
// is BenchmarkTakeRedisFrozen's measure.
func TestTakeWithinDeadlineRedisFrozen(t *testing.T) {
	redistest.Require(t)
	s, srv := frozenStore(t, true)
	for _, deadline := range []time.Duration{20 * time.Millisecond, 5 * time.Millisecond} {
		took := frozenTakes(t, s, deadline, 40, 3, redis.CauseTimeout)
		t.Logf("deadline %v: 120 Takes with Redis frozen: p50 %v, max %v", deadline, took[len(took)/2], took[len(took)-1])
	}
	srv.Cont()
	start := time.Now()
	for {
		_, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "after", Limit: frozenLimit, Cost: 1}})
		if err == nil {
			break
		}
		if time.Since(start) > stateWithin {
			t.Fatalf("Takes still failing %v after SIGCONT: %v", stateWithin, err)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("first successful Take %v after SIGCONT", time.Since(start))
}

// BenchmarkTakeRedisFrozen measures, with Redis frozen and the breaker
// disabled, how far past its deadline a Take returns (max_overrun_ms over
// 40 callers × 3 Takes, per deadline): no call waits for a pipeline it is
// queued behind, so the overrun is only scheduling delay. Without a
// deadline (budget Options.MaxWait) and with the breaker on,
// max_ms_no_deadline is the slowest of 20 Takes. Figures: BENCHMARKS.md.
func BenchmarkTakeRedisFrozen(b *testing.B) {
	redistest.Require(b)
	b.Run("deadline", func(b *testing.B) {
		over := map[time.Duration]time.Duration{}
		for range b.N {
			s, _ := frozenStore(b, true)
			// As in TestTakeWithinDeadlineRedisFrozen: the 5 ms round
			// follows the 20 ms one on the same stall.
			for _, deadline := range []time.Duration{20 * time.Millisecond, 5 * time.Millisecond} {
				took := frozenTakes(b, s, deadline, 40, 3, redis.CauseTimeout)
				if o, ok := over[deadline]; !ok || took[len(took)-1]-deadline > o {
					over[deadline] = took[len(took)-1] - deadline
				}
			}
		}
		for deadline, o := range over {
			b.ReportMetric(float64(o.Microseconds())/1000, "max_overrun_ms/"+deadline.String())
		}
	})
	b.Run("none", func(b *testing.B) {
		var mx time.Duration
		for range b.N {
			s, _ := frozenStore(b, false)
			took := frozenTakes(b, s, 0, 20, 1, redis.CauseStalled)
			mx = max(mx, took[len(took)-1])
		}
		b.ReportMetric(float64(mx.Milliseconds()), "max_ms_no_deadline")
	})
}

// TestFrozenRedisOpensCircuitForCallsWithoutDeadline: callers without a
// deadline (budget Options.MaxWait, 1 s) on a frozen Redis all return
// within their budget with cause stalled (the rules' failure modes, as for
// a dead Redis), none shed: the stalled sockets are reported to the
// breaker once per Timeout, the stall is established after FailFor (1 s),
// when the circuit opens, and every pending call completes with
// ErrStalledOpen, or ErrStalled when its budget ends first. Then the
// circuit is open and a new call is refused by it (ErrStalledOpen), not
// sent. How long the calls wait is BenchmarkTakeRedisFrozen's measure.
func TestFrozenRedisOpensCircuitForCallsWithoutDeadline(t *testing.T) {
	redistest.Require(t)
	s, _ := frozenStore(t, false)
	took := frozenTakes(t, s, 0, 20, 1, redis.CauseStalled)
	t.Logf("20 Takes without deadline, Redis frozen: p50 %v, max %v", took[len(took)/2], took[len(took)-1])
	deadline := time.Now().Add(stateWithin)
	for s.BreakerState() == "closed" || s.Healthy() {
		if time.Now().After(deadline) {
			t.Fatalf("circuit %s, healthy %v, %v after the budgets ran out on a frozen Redis", s.BreakerState(), s.Healthy(), stateWithin)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "after-open", Limit: frozenLimit, Cost: 1}}); !errors.Is(err, redis.ErrStalledOpen) {
		t.Errorf("a Take with the circuit open after a stall: %v, want ErrStalledOpen", err)
	}
}

// TestConcurrentTakesShareConnections: 200 concurrent Takes use at most Options.Pipelines connections at a time plus the idle
// ones (MinIdleConns), never a connection per request, and cost Redis at
// most one EVALSHA each (no extra round trip; concurrent ones share one).
func TestConcurrentTakesShareConnections(t *testing.T) {
	srv, o := standaloneOptions(t)
	o.Timeout = 2 * time.Second // exactness of the counts, not latency
	o.PoolSize = 32
	o.Pipelines = 2
	s := openStore(t, o)
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "warm", Limit: l, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	ctl := srv.Client()
	if err := ctl.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: fmt.Sprintf("c%d", i%20), Limit: l, Cost: 1}}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	info, err := ctl.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	// Concurrent Takes share script invocations (batch.go): at most one
	// EVALSHA per Take, never more (TestConcurrentCallsShareInvocation
	// checks the sharing itself).
	calls := infoField(t, info, "cmdstat_evalsha", "calls")
	t.Logf("200 concurrent Takes: %d EVALSHA", calls)
	if calls < 1 || calls > 200 {
		t.Errorf("cmdstat_evalsha calls = %d for 200 Takes, want 1..200\n%s", calls, info)
	}
	// Connections of the Store: all but the control connection (the
	// one running CLIENT LIST).
	list, err := ctl.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		if !strings.Contains(line, "cmd=client|list") {
			n++
		}
	}
	t.Logf("200 concurrent Takes: %d Store connections (pipelines %d, min idle %d, pool %d)", n, o.Pipelines, o.MinIdleConns, o.PoolSize)
	if n > o.Pipelines+o.MinIdleConns {
		t.Errorf("%d connections after 200 concurrent Takes, want <= pipelines %d + min idle %d", n, o.Pipelines, o.MinIdleConns)
	}
}

// infoField is the integer sub-field of an INFO line such as
// "cmdstat_evalsha:calls=3,usec=...".
func infoField(t *testing.T, info, name, field string) int {
	t.Helper()
	for line := range strings.SplitSeq(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(v, ",") {
			if x, ok := strings.CutPrefix(kv, field+"="); ok {
				n, err := strconv.Atoi(x)
				if err != nil {
					t.Fatalf("INFO %s %s: %q", name, field, x)
				}
				return n
			}
		}
	}
	t.Fatalf("INFO has no %s %s:\n%s", name, field, info)
	return 0
}

// TestNoScriptBurst: after SCRIPT FLUSH, a burst of 100 concurrent Takes
// sends the 20 KiB script at most once per pipeline in flight (EVAL, then
// EVALSHA behind it in the same pipeline), not once per call, and every
// Take is decided exactly (100 of a 60-per-hour key).
func TestNoScriptBurst(t *testing.T) {
	srv, o := standaloneOptions(t)
	o.Timeout = 2 * time.Second // exactness of the counts, not latency
	s := openStore(t, o)
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 60, Period: time.Hour}
	if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "warm", Limit: l, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	ctl := srv.Client()
	if err := ctl.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := ctl.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for range 100 {
		wg.Go(func() {
			d, err := algotest.Take(ctx, s, []algo.Hit{{Key: "burst", Limit: l, Cost: 1}})
			if err != nil {
				t.Error(err)
				return
			}
			if d[0].Allowed {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if allowed != 60 {
		t.Errorf("%d of 100 Takes allowed on a 60-per-hour key, want 60", allowed)
	}
	info, err := ctl.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	evals := 0
	if strings.Contains(info, "cmdstat_eval:") {
		evals = infoField(t, info, "cmdstat_eval", "calls")
	}
	t.Logf("100 concurrent Takes after SCRIPT FLUSH: %d EVAL", evals)
	if evals < 1 || evals > redis.DefaultPipelines {
		t.Errorf("%d EVAL for a burst of 100 after SCRIPT FLUSH, want 1..%d (one per pipeline in flight)", evals, redis.DefaultPipelines)
	}
}

// TestNativeFrozenRedis: native counting (reference mode) has the script
// path's failure behaviour on a frozen Redis (as
// TestTakeWithinDeadlineRedisFrozen and
// TestFrozenRedisOpensCircuitForCallsWithoutDeadline): with a 20 ms
// deadline every Take of an always_charge fixed-window hit returns with
// cause timeout (the breaker off, so that each reaches the batcher); with
// the breaker on and no deadline, with cause stalled once the stall is
// established, the circuit opens and a later Take is refused by it
// (ErrStalledOpen), not sent. After SIGCONT Takes succeed.
func TestNativeFrozenRedis(t *testing.T) {
	redistest.Require(t)
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	hit := func(k string) []algo.Hit { return []algo.Hit{{Key: k, Limit: fw, Cost: 1, Charge: true}} }
	for _, breakerOff := range []bool{true, false} {
		srv := redistest.Standalone(t)
		o := redis.DefaultOptions()
		o.URL = srv.URL()
		o.NativeCounting = true
		o.Breaker.Disabled = breakerOff
		s := openStore(t, o)
		if _, err := algotest.Take(context.Background(), s, hit("warm")); err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		deadline, callers, cause := 20*time.Millisecond, 40, redis.CauseTimeout
		if !breakerOff {
			deadline, callers, cause = 0, 20, redis.CauseStalled
		}
		var wg sync.WaitGroup
		for g := range callers {
			wg.Go(func() {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if deadline > 0 {
					ctx, cancel = context.WithTimeout(ctx, deadline)
				}
				defer cancel()
				_, err := algotest.Take(ctx, s, hit("k"+strconv.Itoa(g)))
				if redis.CauseOf(err) != cause {
					t.Errorf("breaker off %v, Redis frozen: Take: %v (cause %q), want cause %q", breakerOff, err, redis.CauseOf(err), cause)
				}
			})
		}
		wg.Wait()
		if !breakerOff {
			until := time.Now().Add(stateWithin)
			for s.BreakerState() == "closed" {
				if time.Now().After(until) {
					t.Fatalf("circuit still closed %v after the budgets ran out on a frozen Redis", stateWithin)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := algotest.Take(context.Background(), s, hit("after-open")); !errors.Is(err, redis.ErrStalledOpen) {
				t.Errorf("a native Take with the circuit open after a stall: %v, want ErrStalledOpen", err)
			}
		}
		srv.Cont()
		start := time.Now()
		for {
			if _, err := algotest.Take(context.Background(), s, hit("after")); err == nil {
				break
			} else if time.Since(start) > stateWithin {
				t.Fatalf("native Takes still failing %v after SIGCONT: %v", stateWithin, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
