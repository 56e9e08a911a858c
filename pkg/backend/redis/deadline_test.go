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
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// deadlineSlack is how far past its deadline a Take may return in these
// tests: generous for -race on a shared 2-core host, where waking the
// caller at its deadline took up to 5.8 ms more when measured, and over
// 10 ms with other test packages running (without -race the overrun is
// about 1-2 ms, see BENCHMARKS.md). It stays below the 20 ms Timeout, so
// the old behaviour (a call waiting for the pipeline ahead of it, then for
// its own Timeout: 40-45 ms) fails.
const deadlineSlack = 15 * time.Millisecond

// TestTakeWithinDeadlineRedisFrozen: with Redis frozen (SIGSTOP), 40
// concurrent callers each make 3 Takes with an Envoy-like deadline. Every
// Take returns within its budget (deadline less the margin) plus
// deadlineSlack, whether it was in flight or queued behind a stuck
// invocation: no call waits for a pipeline it is queued behind. With a
// 20 ms deadline a request has been pending for a Timeout (10 ms) by then
// and Redis has sent nothing since, so the error is a timeout (the rules'
// failure modes decide); the 5 ms round follows while Redis is still
// frozen, so it is a timeout too (a 5 ms budget on a fresh stall is a
// deadline: TestLivenessStallIsPerSocketAndKernelBased). The breaker is
// disabled so that every Take reaches the batcher. After SIGCONT, Takes
// succeed again at once.
func TestTakeWithinDeadlineRedisFrozen(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Breaker.Disabled = true
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	l := algo.Limit{Kind: algo.TokenBucket, Rate: 100, Period: time.Second}
	take := func(ctx context.Context, key string) error {
		_, err := s.Take(ctx, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
		return err
	}
	if err := take(context.Background(), "warm"); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	t.Cleanup(func() {
		if srv.Alive() {
			srv.Cont()
		}
	})
	for _, tc := range []struct {
		deadline time.Duration
		cause    string
	}{{20 * time.Millisecond, redis.CauseTimeout}, {5 * time.Millisecond, redis.CauseTimeout}} {
		var mu sync.Mutex
		var took []time.Duration
		var wg sync.WaitGroup
		for g := range 40 {
			wg.Go(func() {
				for i := range 3 {
					ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
					t0 := time.Now()
					err := take(ctx, "k"+strconv.Itoa(g*3+i))
					d := time.Since(t0)
					cancel()
					if redis.CauseOf(err) != tc.cause {
						t.Errorf("deadline %v, Redis frozen: Take: %v (cause %q), want cause %q", tc.deadline, err, redis.CauseOf(err), tc.cause)
					}
					mu.Lock()
					took = append(took, d)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(took)
		p50, mx := took[len(took)/2], took[len(took)-1]
		t.Logf("deadline %v: 120 Takes with Redis frozen: p50 %v, max %v", tc.deadline, p50, mx)
		if mx > tc.deadline+deadlineSlack {
			t.Errorf("deadline %v: a Take took %v with Redis frozen, want <= %v + %v", tc.deadline, mx, tc.deadline, deadlineSlack)
		}
	}

	srv.Cont()
	start := time.Now()
	for take(context.Background(), "after") != nil {
		if time.Since(start) > 2*time.Second {
			t.Fatal("Takes still failing 2 s after SIGCONT")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("first successful Take %v after SIGCONT", time.Since(start))
}

// TestFrozenRedisOpensCircuitForCallsWithoutDeadline: callers without a
// deadline (budget Options.MaxWait, 1 s) wait at most about their budget
// on a frozen Redis: the stalled sockets are reported to the breaker once
// per Timeout, the circuit opens after FailFor (1 s) and every pending
// call completes with ErrStalledOpen, or the budget ends first
// (ErrCallTimeout); both have cause timeout (shed, never admitted
// uncounted). Then the circuit is open and new calls fail at once.
func TestFrozenRedisOpensCircuitForCallsWithoutDeadline(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	s := defaultStore(t, srv)
	l := algo.Limit{Kind: algo.TokenBucket, Rate: 100, Period: time.Second}
	if _, err := s.Take(context.Background(), []algo.Hit{{Key: "warm", Limit: l, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	t.Cleanup(func() {
		if srv.Alive() {
			srv.Cont()
		}
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var took []time.Duration
	for g := range 20 {
		wg.Go(func() {
			t0 := time.Now()
			_, err := s.Take(context.Background(), []algo.Hit{{Key: "k" + strconv.Itoa(g), Limit: l, Cost: 1}})
			d := time.Since(t0)
			if c := redis.CauseOf(err); c != redis.CauseTimeout {
				t.Errorf("Take with Redis frozen, no deadline: %v (cause %q), want timeout", err, c)
			}
			mu.Lock()
			took = append(took, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(took)
	mx := took[len(took)-1]
	t.Logf("20 Takes without deadline, Redis frozen: p50 %v, max %v", took[len(took)/2], mx)
	if limit := redis.DefaultMaxWait + 300*time.Millisecond; mx > limit {
		t.Errorf("a Take without deadline took %v with Redis frozen, want about its budget (%v)", mx, redis.DefaultMaxWait)
	}
	deadline := time.Now().Add(2 * time.Second)
	for s.BreakerState() == "closed" || s.Healthy() {
		if time.Now().After(deadline) {
			t.Fatalf("circuit %s, healthy %v, 2 s after the budgets ran out on a frozen Redis", s.BreakerState(), s.Healthy())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t0 := time.Now()
	_, err := s.Take(context.Background(), []algo.Hit{{Key: "after-open", Limit: l, Cost: 1}})
	if d := time.Since(t0); !errors.Is(err, redis.ErrStalledOpen) || d > 50*time.Millisecond {
		t.Errorf("a Take with the circuit open after a stall: %v after %v, want ErrStalledOpen at once", err, d)
	}
}

// TestConcurrentTakesShareConnections: 200 concurrent Takes use at most Options.Pipelines connections at a time plus the idle
// ones (MinIdleConns), never a connection per request, and cost Redis at
// most one EVALSHA each (no extra round trip; concurrent ones share one).
func TestConcurrentTakesShareConnections(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 2 * time.Second // exactness of the counts, not latency
	o.PoolSize = 32
	o.Pipelines = 2
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	if _, err := s.Take(ctx, []algo.Hit{{Key: "warm", Limit: l, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	ctl := srv.Client()
	if err := ctl.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			if _, err := s.Take(ctx, []algo.Hit{{Key: fmt.Sprintf("c%d", i%20), Limit: l, Cost: 1}}); err != nil {
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
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 2 * time.Second // exactness of the counts, not latency
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 60, Period: time.Hour}
	if _, err := s.Take(ctx, []algo.Hit{{Key: "warm", Limit: l, Cost: 1}}); err != nil {
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
			d, err := s.Take(ctx, []algo.Hit{{Key: "burst", Limit: l, Cost: 1}})
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
