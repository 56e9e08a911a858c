package redise2e

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// benchKeys and benchConcurrency match the load shape: 50
// concurrent callers over 10,000 descriptor values.
const (
	benchKeys        = 10000
	benchConcurrency = 50
)

// benchConfig is scripts/bench/bench.yaml: a limit high enough that almost
// every decision is OK (the expensive path: the counter is written).
func benchConfig(t testing.TB) string {
	b, err := os.ReadFile("../../scripts/bench/bench.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func benchRequests() []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, benchKeys)
	for i := range reqs {
		reqs[i] = req("bench", []string{"user", "user-" + strconv.Itoa(i)})
	}
	return reqs
}

// runBench calls svc.ShouldRateLimit from benchConcurrency goroutines
// (b.SetParallelism over GOMAXPROCS) on random values and fails b when a
// call errors or the backend fails.
func runBench(b *testing.B, svc *service.Service) {
	reqs := benchRequests()
	var seed atomic.Uint64
	var over atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(max(1, benchConcurrency/max(1, parallelism())))
	b.ResetTimer()
	var mu sync.Mutex
	var lat latencies
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 1))
		ctx := context.Background()
		local := make(latencies, 0, 1024)
		defer func() { mu.Lock(); lat = append(lat, local...); mu.Unlock() }()
		for pb.Next() {
			t0 := time.Now()
			resp, err := svc.ShouldRateLimit(ctx, reqs[rng.IntN(len(reqs))])
			local = append(local, time.Since(t0))
			if err != nil {
				b.Error(err)
				return
			}
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				over.Add(1)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(over.Load()), "over_limit")
	// Latency of ShouldRateLimit (in-process: no gRPC), to judge
	// Options.Timeout against the tail.
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(lat.pct(0.5)), "p50_us")
	b.ReportMetric(us(lat.pct(0.99)), "p99_us")
	b.ReportMetric(us(lat.pct(0.999)), "p99.9_us")
	b.ReportMetric(us(lat.pct(1)), "max_us")
}

// BenchmarkShouldRateLimitRedis measures the whole decision path (request
// validation, matching, key building, one EVALSHA on a real redis-server
// with production default options, response with headers) from 50
// concurrent goroutines over 10,000 keys. The server shares the machine.
func BenchmarkShouldRateLimitRedis(b *testing.B) {
	redistest.Require(b)
	srv := redistest.Standalone(b)
	o := standaloneOpts(srv.URL())
	// RATELIMITD_BENCH_POOL, RATELIMITD_BENCH_TIMEOUT and
	// RATELIMITD_BENCH_PIPELINES override the defaults (to compare pool
	// sizes, budgets and pipelines in flight); unset means defaults.
	if v, err := strconv.Atoi(os.Getenv("RATELIMITD_BENCH_POOL")); err == nil {
		o.PoolSize = v
	}
	if v, err := time.ParseDuration(os.Getenv("RATELIMITD_BENCH_TIMEOUT")); err == nil {
		o.Timeout = v
	}
	if v, err := strconv.Atoi(os.Getenv("RATELIMITD_BENCH_PIPELINES")); err == nil {
		o.Pipelines = v
	}
	b.Logf("redis options: pool %d, timeout %v, pipelines %d", o.PoolSize, o.Timeout, o.Pipelines)
	in := newInstance(b, o, loadSet(b, benchConfig(b)))
	warm(b, []*instance{in})
	runBench(b, in.svc)
	// Backend errors (a call past the 10 ms budget when the machine is
	// busy, then circuit_open answers) make decisions cheap fail-opens, which
	// would flatter the numbers: report them, and fail above 0.1%.
	var errs float64
	for _, n := range causes(b, in.reg) {
		errs += n
	}
	b.ReportMetric(errs, "backend_errors")
	if errs > float64(b.N)/1000 {
		b.Errorf("%v backend errors in %d decisions: %v", errs, b.N, causes(b, in.reg))
	}
}

// BenchmarkShouldRateLimitMemory is the same path over the memory backend,
// for comparison.
func BenchmarkShouldRateLimitMemory(b *testing.B) {
	st := newMemory(b)
	svc, err := service.New(service.Options{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	svc.SetPolicy(loadSet(b, benchConfig(b)))
	runBench(b, svc)
}

// parallelism is GOMAXPROCS, as b.RunParallel uses it.
func parallelism() int { return runtime.GOMAXPROCS(0) }
