package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// TestLocalCacheStatsd: the local over-limit cache as envoyproxy/ratelimit
// reports it through statsd, with EXTRA_TAGS: a denial answered from the
// cache counts over_limit and over_limit_with_local_cache, and the gauges
// ratelimit.localcache.hitCount/missCount/lookupCount count the lookups
// (real Redis, the service's own counting, tags as gostats serializes
// them).
func TestLocalCacheStatsd(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC) // the stores' clock
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) (closingStore, error)
	}{
		{"redis", func(t *testing.T) (closingStore, error) {
			ro := redis.DefaultOptions()
			ro.URL, ro.Timeout, ro.PoolSize, ro.MinIdleConns, ro.LocalCacheSize = redistest.Standalone(t).URL(), 5*time.Second, 2, 0, 8
			ro.Now = func() time.Time { return now }
			ro.CacheUncharged = true // the reference's counting, as in reference mode
			s, err := redis.New(ro)
			if err == nil {
				// Warm waits for the cache's credit subscription: until
				// then the cache answers nothing.
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if err := s.Warm(ctx); err != nil {
					t.Fatal(err)
				}
			}
			return s, err
		}},
		{"memcache", func(t *testing.T) (closingStore, error) {
			mo := memcache.DefaultOptions()
			mo.Addrs, mo.Timeout, mo.LocalCacheSize = []string{memcachetest.Start(t).Addr()}, 5*time.Second, 8
			mo.Now = func() time.Time { return now }
			return memcache.New(mo)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := tc.store(t)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			testLocalCacheStatsd(t, store, now)
		})
	}
}

// testLocalCacheStatsd: 23 calls on a 20-per-minute limit, the last two
// answered by store's local over-limit cache, as the reference's statsd
// stats count them.
func testLocalCacheStatsd(t *testing.T, store service.Store, now time.Time) {
	sink := testproc.ListenStatsd(t)
	o := serveopts.Defaults()
	o.StatsdAddr, o.StatsdFlushInterval, o.StatsdTags = sink.Addr(), time.Hour, "foo:bar,a:b"
	sc, stop, err := startStatsd(o, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	addLocalCacheStats(sc, store)
	counting, err := policy.ParseCounting("always_charge")
	if err != nil {
		t.Fatal(err)
	}
	svc := newTestService(t, service.Options{Store: store, Statsd: sc, Counting: counting, Now: func() time.Time { return now }, Logger: slog.New(slog.DiscardHandler)})
	setConfig(t, svc, "domain: another\ndescriptors:\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n")

	req := &rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "key2", Value: "v"}}}}}
	for i := range 23 {
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 20; (resp.GetOverallCode() == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("call %d: %v", i, resp.GetOverallCode())
		}
	}
	sc.Flush()
	const tags = ".__a=b.__foo=bar"
	sink.WaitLine(t, "ratelimit.localcache.lookupCount")
	got, bad := sink.Totals()
	if len(bad) > 0 {
		t.Fatalf("malformed statsd lines %q", bad)
	}
	p := "ratelimit.service.rate_limit.another.key2."
	for name, want := range map[string]float64{
		p + "total_hits" + tags + "|c":                   23,
		p + "within_limit" + tags + "|c":                 20,
		p + "over_limit" + tags + "|c":                   3,
		p + "over_limit_with_local_cache" + tags + "|c":  2, // calls 22 and 23; 21 was the backend's denial
		"ratelimit.localcache.hitCount" + tags + "|g":    2,
		"ratelimit.localcache.missCount" + tags + "|g":   21,
		"ratelimit.localcache.lookupCount" + tags + "|g": 23,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}

// closingStore is a store that holds connections or goroutines until
// Close.
type closingStore interface {
	service.Store
	Close() error
}
