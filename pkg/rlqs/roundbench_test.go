package rlqs

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// delayedLeases adds delay to every Lease call of a real store, as a
// store across a network would, and counts the calls.
type delayedLeases struct {
	LeaseStore
	delay time.Duration
	calls atomic.Int64
}

func (d *delayedLeases) Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	d.calls.Add(1)
	time.Sleep(d.delay)
	return d.LeaseStore.Lease(ctx, req)
}

// BenchmarkRound300 measures one round (charge, demand sharing and the
// leases of 300 counters, one stream with a bucket on each, a limit no
// round spends, so that every round leases each counter) on a real
// Redis: its duration, the script invocations Redis ran per round (the
// leases' and the charges') and the lease calls among them. The
// delay variants add that latency to every lease call.
func BenchmarkRound300(b *testing.B) {
	for _, delay := range []time.Duration{0, time.Millisecond} {
		b.Run("lease-delay="+delay.String(), func(b *testing.B) {
			srv := redistest.Standalone(b)
			o := redis.DefaultOptions()
			o.URL = srv.URL()
			store, err := redis.New(o)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = store.Close() })
			// The server's clock stands still: every round divides the same
			// reports, none of whose buckets goes silent.
			clock := &fakeClock{t: time.Now()}
			leases := &delayedLeases{LeaseStore: store, delay: delay}
			s, err := New(Options{Store: store, Demand: store, Leases: leases, Registerer: prometheus.NewRegistry(),
				Replica: "a", Now: clock.Now, joinTimeout: time.Minute, roundTimeout: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			s.SetPolicy(loadSet(b, strings.Replace(manyTenantsConfig, "50}", "1000000}", 1)))
			b.Cleanup(s.Shutdown)
			ms := &memStream{in: make(chan *rlqspb.RateLimitQuotaUsageReports)}
			ms.ctx, ms.cancel = context.WithCancel(context.Background())
			b.Cleanup(ms.cancel)
			ms.envoy = &simEnvoy{t: b, clock: clock}
			go func() { _ = s.StreamRateLimitQuotas(ms) }()
			var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
			for i := range 300 {
				us = append(us, usage(map[string]string{"api": "x", "tenant": fmt.Sprint("t", i)}, 0, 2, 0))
			}
			ms.in <- &rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: us}
			waitFor(b, "report processed", func() bool { return s.reported.Load() == 1 })
			s.Round(context.Background())
			before, leased := scriptCalls(b, srv), leases.calls.Load()
			b.ResetTimer()
			for b.Loop() {
				s.Round(context.Background())
			}
			b.StopTimer()
			calls, leased := scriptCalls(b, srv)-before, leases.calls.Load()-leased
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/round")
			b.ReportMetric(float64(calls)/float64(b.N), "scripts/round")
			b.ReportMetric(float64(leased)/float64(b.N), "leases/round")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// scriptCalls is the script invocations srv has run (EVAL, EVALSHA,
// FCALL and their read-only forms, from INFO commandstats): one per
// client call of the store, where total_commands_processed also counts
// the commands the scripts run.
func scriptCalls(b *testing.B, srv *redistest.Server) int64 {
	v, err := srv.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum int64
	for line := range strings.SplitSeq(v, "\r\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		switch strings.TrimPrefix(name, "cmdstat_") {
		case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
			n, _, _ := strings.Cut(rest, ",")
			c, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += c
		}
	}
	return sum
}
