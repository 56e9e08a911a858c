package redis_test

import (
	"context"
	"runtime/metrics"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
)

// goroutinesCreated is the process' count of goroutines created so far.
func goroutinesCreated(t *testing.T) uint64 {
	t.Helper()
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("runtime/metrics: %s unsupported", s[0].Name)
	}
	return s[0].Value.Uint64()
}

// TestSequentialTakesStayOnTheLoop: one caller at a time (the c=1 path),
// n Takes on a healthy Redis create no goroutine each (the flush loops are
// resident), take no connection from the go-redis pool each (a flush loop
// pins its own, so the pool's per-Get health check is not on the path),
// and do not keep the sweeper ticking (it is woken only for a call that
// may outlive its flush). The bounds leave room for scheduling delay (a
// loop descheduled right after answering makes the next call queue, which
// wakes the sweeper for a tick) but not for one goroutine, one pool Get
// or a sweeper running through the whole run.
func TestSequentialTakesStayOnTheLoop(t *testing.T) {
	_, o := standaloneOptions(t)
	o.Timeout = time.Second // latency is not under test
	o.HealthInterval = time.Hour
	s := openStore(t, o)
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 30, Period: time.Hour}
	hits := make([][]algo.Hit, 16)
	for i := range hits {
		hits[i] = []algo.Hit{{Key: "seq" + strconv.Itoa(i), Limit: l, Cost: 1}}
		if _, err := algotest.Take(ctx, s, hits[i]); err != nil {
			t.Fatal(err)
		}
	}
	const n = 1000
	out := make([]algo.Decision, 1)
	st0, g0, w0 := *s.PoolStats(), goroutinesCreated(t), s.SweeperTicks()
	start := time.Now()
	for i := range n {
		if err := s.Take(ctx, hits[i%len(hits)], out); err != nil || !out[0].Allowed {
			t.Fatalf("Take %d: %+v, %v", i, out[0], err)
		}
	}
	elapsed := time.Since(start)
	st1, g1, w1 := *s.PoolStats(), goroutinesCreated(t), s.SweeperTicks()
	gets := (st1.Hits + st1.Misses) - (st0.Hits + st0.Misses)
	created, ticks := g1-g0, w1-w0
	t.Logf("%d sequential Takes in %v: %d goroutines created, %d pool Gets, %d sweeper ticks", n, elapsed, created, gets, ticks)
	if created > n/10 {
		t.Errorf("%d goroutines created for %d Takes, want at most %d (no goroutine per call)", created, n, n/10)
	}
	if gets > n/10 {
		t.Errorf("%d pool Gets for %d Takes, want at most %d (the flush loops' connections are pinned)", gets, n, n/10)
	}
	// The sweeper's tick is 1 ms here; running through the whole run it
	// would tick about once per ms.
	if limit := int64(elapsed/time.Millisecond) / 10; ticks > limit {
		t.Errorf("%d sweeper ticks in %v, want at most %d (parked while no call outlives its flush)", ticks, elapsed, limit)
	}
}
