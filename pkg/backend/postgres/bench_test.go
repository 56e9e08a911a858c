package postgres_test

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// decider is the Store shape both benchmarked stores have.
type decider interface {
	Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error
}

// BenchmarkDecision: one-hit decisions (a day quota that always admits,
// keys spread so that no two goroutines share a row) on the durable store
// (PostgreSQL with fsync on, the default of a real server; the same with
// Options.AsyncCommit; a server with fsync off) and on the Redis store (no
// local cache), in the same run, at concurrency 1 and 50; each reports
// p50 and p99 latency and decisions per second.
//
//	go test -run '^$' -bench BenchmarkDecision -benchtime 3s ./pkg/backend/postgres/
func BenchmarkDecision(b *testing.B) {
	stores := map[string]decider{}
	srv := pgtest.Start(b, pgtest.WithFsync())
	db := srv.CreateDB(b)
	stores["durable"] = newStore(b, srv, db, func(o *postgres.Options) { o.MaxConns = 64; o.SweepInterval = 0 })
	stores["durable_async_commit"] = newStore(b, srv, db, func(o *postgres.Options) {
		o.MaxConns, o.SweepInterval, o.AsyncCommit = 64, 0, true
	})
	nofsync := pgtest.Start(b)
	stores["durable_fsync_off"] = newStore(b, nofsync, nofsync.CreateDB(b), func(o *postgres.Options) { o.MaxConns = 64; o.SweepInterval = 0 })
	rsrv := redistest.Standalone(b)
	ro := redis.DefaultOptions()
	ro.URL, ro.Timeout, ro.LocalCacheSize, ro.PoolSize = rsrv.URL(), time.Second, 0, 64
	rs, err := redis.New(ro)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rs.Close() })
	stores["redis"] = rs
	day := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 40, Period: 24 * time.Hour}
	for _, name := range []string{"durable", "durable_async_commit", "durable_fsync_off", "redis"} {
		s := stores[name]
		for _, c := range []int{1, 50} {
			b.Run(name+"/c="+strconv.Itoa(c), func(b *testing.B) {
				benchDecisions(b, s, day, c)
			})
		}
	}
}

// BenchmarkHotKey: c concurrent decisions on one key of the durable
// store (fsync on), as a tenant's monthly quota under load is.
func BenchmarkHotKey(b *testing.B) {
	srv := pgtest.Start(b, pgtest.WithFsync())
	s := newStore(b, srv, srv.CreateDB(b), func(o *postgres.Options) { o.MaxConns = 64; o.SweepInterval = 0 })
	day := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 40, Period: 24 * time.Hour}
	for _, c := range []int{1, 16, 50} {
		b.Run("c="+strconv.Itoa(c), func(b *testing.B) {
			benchDecisionsOn(b, s, day, c, func(string, int) string { return "bench/hot" })
		})
	}
}

func benchDecisions(b *testing.B, s decider, l algo.Limit, c int) {
	benchDecisionsOn(b, s, l, c, func(g string, i int) string { return "bench/" + g + "/" + strconv.Itoa(i%64) })
}

// benchDecisionsOn runs b.N decisions of l, c at a time, goroutine g's
// i-th on key(g, i), and reports their latency and throughput.
func benchDecisionsOn(b *testing.B, s decider, l algo.Limit, c int, key func(g string, i int) string) {
	var gid atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	run := func(next func() bool) {
		g := strconv.FormatInt(gid.Add(1), 10)
		var mine []time.Duration
		d := make([]algo.Decision, 1)
		for i := 0; next(); i++ {
			hit := []algo.Hit{{Key: key(g, i), Limit: l, Cost: 1}}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			start := time.Now()
			err := s.Take(ctx, hit, d)
			mine = append(mine, time.Since(start))
			cancel()
			if err != nil || !d[0].Allowed {
				b.Errorf("Take: %v %+v", err, d)
				return
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	}
	b.ResetTimer()
	start := time.Now()
	if c == 1 {
		n := 0
		run(func() bool { n++; return n <= b.N })
	} else {
		b.SetParallelism((c + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) { run(pb.Next) })
	}
	el := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(len(lat))/el.Seconds(), "decisions/s")
}
