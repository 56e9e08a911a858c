package rlqs

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// manyTenantsConfig limits every tenant of one api on its own counter.
const manyTenantsConfig = `domain: edge
descriptors:
  - key: api
    value: x
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 50}
`

// TestManyBucketsShareDemand: 5 Envoys with 300 buckets each on a real
// Redis store with the default options (a 10 ms per-request timeout).
// Sharing 300 counters' demand, and leasing their assignments, is
// background work of the round, bounded by the round's budget, not by the
// per-request timeout: no round fails.
func TestManyBucketsShareDemand(t *testing.T) {
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	store, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	reg := prometheus.NewRegistry()
	// The rounds (300 counters' demand and leases, one call each) get a
	// budget a loaded host meets; the per-request timeout stays 10 ms.
	s, err := New(Options{Store: store, Demand: store, Leases: store, Registerer: reg, Replica: "a", roundTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.SetPolicy(loadSet(t, manyTenantsConfig))
	t.Cleanup(s.Shutdown)

	const envoys, tenants = 5, 300
	for e := 0; e < envoys; e++ {
		ms := &memStream{in: make(chan *rlqspb.RateLimitQuotaUsageReports)}
		ms.ctx, ms.cancel = context.WithCancel(context.Background())
		t.Cleanup(ms.cancel)
		ms.envoy = &simEnvoy{t: t, clock: &fakeClock{t: time.Now()}}
		go func() { _ = s.StreamRateLimitQuotas(ms) }()
		for round := 0; round < 2; round++ {
			var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
			for i := 0; i < tenants; i++ {
				us = append(us, usage(map[string]string{"api": "x", "tenant": fmt.Sprint("t", i)}, time.Duration(round)*time.Second, 2, 0))
			}
			ms.in <- &rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: us}
		}
	}
	waitFor(t, "reports processed", func() bool { return s.reported.Load() == 2*envoys })
	for i := 0; i < 5; i++ {
		s.Round(context.Background())
	}
	for _, op := range []string{"demand", "charge", "reserve"} {
		if n := testutil.ToFloat64(s.m.errors.WithLabelValues(op)); n != 0 {
			t.Errorf("ratelimitd_rlqs_store_errors_total{op=%q} = %v, want 0", op, n)
		}
	}
}
