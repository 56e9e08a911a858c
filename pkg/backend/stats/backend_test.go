package stats

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeBackend struct {
	state string
	hits  uint64
}

func (f *fakeBackend) Stats() Stats {
	return Stats{Has: Breaker | CacheHits | ClusterRefunds, BreakerState: f.state, CacheHits: f.hits, ClusterRefundErrors: 2}
}

// fakeCredits is a store with the Redis credit channel's figures.
type fakeCredits struct{ live bool }

func (f *fakeCredits) Stats() Stats {
	return Stats{Has: Credits, CacheEnabled: true, CreditsLive: f.live, CreditPublishErrors: 3}
}

// none is a store without figures.
func none() Stats { return Stats{} }

// TestCreditMetrics: ratelimitd_local_cache_live follows the credit
// subscription; publish errors are counted.
func TestCreditMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := &fakeCredits{}
	if err := RegisterBackend(reg, f.Stats); err != nil {
		t.Fatal(err)
	}
	gauge := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "ratelimitd_local_cache_live" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("ratelimitd_local_cache_live not exported")
		return 0
	}
	if g := gauge(); g != 0 {
		t.Errorf("live %v before the subscription, want 0", g)
	}
	f.live = true
	if g := gauge(); g != 1 {
		t.Errorf("live %v once subscribed, want 1", g)
	}
	if got := testutil.ToFloat64(mustCollector(t, reg, "ratelimitd_credit_publish_errors_total")); got != 3 {
		t.Errorf("publish errors %v, want 3", got)
	}
}

func TestBackendMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := &fakeBackend{state: "closed", hits: 5}
	if err := RegisterBackend(reg, b.Stats); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP ratelimitd_backend_circuit_state Circuit breaker in front of the backend: 1 for the current state (closed, open, half_open), else 0.
# TYPE ratelimitd_backend_circuit_state gauge
ratelimitd_backend_circuit_state{state="closed"} 0
ratelimitd_backend_circuit_state{state="half_open"} 0
ratelimitd_backend_circuit_state{state="open"} 1
`
	b.state = "open"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimitd_backend_circuit_state"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(mustCollector(t, reg, "ratelimitd_local_cache_hits_total")); got != 5 {
		t.Errorf("cache hits = %v, want 5", got)
	}
	// A store without these figures exports nothing.
	empty := prometheus.NewRegistry()
	if err := RegisterBackend(empty, none); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(empty); n != 0 {
		t.Errorf("memory-like store exported %d series", n)
	}
}

func mustCollector(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			v := mf.GetMetric()[0].GetCounter().GetValue()
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
			c.Add(v)
			return c
		}
	}
	t.Fatalf("%s not exported", name)
	return nil
}

type fakeMemory struct{ sketched, refused uint64 }

func (f fakeMemory) Stats() Stats {
	return Stats{Has: FullHits, Sketched: f.sketched, Refused: f.refused}
}

// TestMemoryMetrics: the in-memory stores, backend and fallback, export
// their full-store hits under ratelimitd_memory_full_hits_total; other
// stores export nothing.
func TestMemoryMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, m := range []struct {
		store string
		f     fakeMemory
	}{{"backend", fakeMemory{3, 1}}, {"fallback", fakeMemory{7, 0}}} {
		if err := RegisterMemory(reg, m.store, m.f.Stats); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP ratelimitd_memory_full_hits_total Hits of new keys a full in-memory store had no slot for: decided by its sketch (sketched), or denied (refused: sliding log and concurrency).
# TYPE ratelimitd_memory_full_hits_total counter
ratelimitd_memory_full_hits_total{decision="refused",store="backend"} 1
ratelimitd_memory_full_hits_total{decision="refused",store="fallback"} 0
ratelimitd_memory_full_hits_total{decision="sketched",store="backend"} 3
ratelimitd_memory_full_hits_total{decision="sketched",store="fallback"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimitd_memory_full_hits_total"); err != nil {
		t.Error(err)
	}
	empty := prometheus.NewRegistry()
	if err := RegisterMemory(empty, "backend", none); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(empty); n != 0 {
		t.Errorf("a store without full-store hits exported %d series", n)
	}
}
