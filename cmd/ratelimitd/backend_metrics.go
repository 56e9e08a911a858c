package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// Optional store interfaces read by the backend metrics (implemented by the
// Redis store; the memory store has none of them: see approximator).
type (
	breakerStater interface{ BreakerState() string }
	cacheHitter   interface{ CacheHits() uint64 }
	cacheLookuper interface {
		CacheEnabled() bool
		CacheHits() uint64
		CacheMisses() uint64
	}
	refundCounter interface{ RefundErrors() uint64 }
	creditWatcher interface {
		CacheEnabled() bool
		CreditsLive() bool
		CreditPublishErrors() uint64
	}
	masterChanger interface{ MasterChanges() uint64 }
	refundFailer  interface{ RefundFailures() uint64 }
)

// approximator is a memory store (the memory backend, or the
// failure_mode local fallback) that decides new keys while full.
type approximator interface {
	Approximated() (sketched, refused uint64)
}

// registerMemoryMetrics exports ratelimitd_memory_full_hits_total for the
// in-memory stores: the backend when it is the memory store, and the
// failure_mode local fallback; labels store (backend, fallback) and
// decision (sketched, refused).
func registerMemoryMetrics(reg prometheus.Registerer, backend, fallback any) error {
	for _, st := range []struct {
		name string
		s    any
	}{{"backend", backend}, {"fallback", fallback}} {
		a, ok := st.s.(approximator)
		if !ok {
			continue
		}
		for _, d := range []string{"sketched", "refused"} {
			c := prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        "ratelimitd_memory_full_hits_total",
				Help:        "Hits of new keys a full in-memory store had no slot for: decided by its sketch (sketched), or denied (refused: sliding log and concurrency).",
				ConstLabels: prometheus.Labels{"store": st.name, "decision": d},
			}, func() float64 {
				sk, ref := a.Approximated()
				if d == "sketched" {
					return float64(sk)
				}
				return float64(ref)
			})
			if err := reg.Register(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// breakerStates are the label values of ratelimitd_backend_circuit_state.
var breakerStates = []string{"closed", "open", "half_open"}

// registerBackendMetrics exports what the store reports about itself:
// circuit-breaker state (one series per state, 1 for the current one),
// local over-limit cache hits, and failed Cluster compensating refunds.
// Stores without these methods export nothing.
func registerBackendMetrics(reg prometheus.Registerer, store any) error {
	var cs []prometheus.Collector
	// counter exports v, a count the store keeps, as the counter name.
	counter := func(name, help string, v func() uint64) {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) }))
	}
	if b, ok := store.(breakerStater); ok {
		for _, st := range breakerStates {
			cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "ratelimitd_backend_circuit_state",
				Help:        "Circuit breaker in front of the backend: 1 for the current state (closed, open, half_open), else 0.",
				ConstLabels: prometheus.Labels{"state": st},
			}, func() float64 {
				if b.BreakerState() == st {
					return 1
				}
				return 0
			}))
		}
	}
	if c, ok := store.(cacheHitter); ok {
		counter("ratelimitd_local_cache_hits_total",
			"Local over-limit cache lookups that found a denial (one lookup per cacheable hit of a request).", c.CacheHits)
	}
	if c, ok := store.(cacheLookuper); ok {
		counter("ratelimitd_local_cache_misses_total",
			"Local over-limit cache lookups that found no denial (no entry, an expired one, or a smaller cost than the one cached).", c.CacheMisses)
	}
	if r, ok := store.(refundCounter); ok {
		counter("ratelimitd_cluster_refund_errors_total",
			"Redis Cluster compensating refunds that failed (a slot group that allowed could not be undone after another denied).", r.RefundErrors)
	}
	if w, ok := store.(creditWatcher); ok {
		counter("ratelimitd_credit_publish_errors_total",
			"Refunds and resets whose keys could not be published on the Redis credit channel: other instances may deny those keys until their cached retry time.", w.CreditPublishErrors)
		if w.CacheEnabled() {
			cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "ratelimitd_local_cache_live",
				Help: "1 while the local over-limit cache answers (its subscription to the Redis credit channel is confirmed), 0 while it is flushed and waits for it.",
			}, func() float64 {
				if w.CreditsLive() {
					return 1
				}
				return 0
			}))
		}
	}
	if m, ok := store.(masterChanger); ok {
		counter("ratelimitd_backend_master_changes_total",
			"Times the Redis Sentinel master the store writes to changed address (failovers; 0 outside Sentinel mode).", m.MasterChanges)
	}
	if r, ok := store.(refundFailer); ok {
		counter("ratelimitd_backend_refund_errors_total",
			"memcached refunds (DECR of a denied or failed request's increments) that failed; each leaves those units counted until the window ends.", r.RefundFailures)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Gauge names of envoyproxy/ratelimit's local cache stats (its freecache's
// counters, under "ratelimit.localcache").
const (
	refLocalCacheHits    = "ratelimit.localcache.hitCount"
	refLocalCacheMisses  = "ratelimit.localcache.missCount"
	refLocalCacheLookups = "ratelimit.localcache.lookupCount"
)

// addLocalCacheStats sends the store's local over-limit cache lookups as
// envoyproxy/ratelimit's gauges ratelimit.localcache.hitCount, missCount
// and lookupCount (their sum), set before every statsd flush; as the
// reference, only while the cache is enabled. No-op when sc is nil or the
// store has no such cache.
func addLocalCacheStats(sc *statsd.Client, store any) {
	c, ok := store.(cacheLookuper)
	if sc == nil || !ok || !c.CacheEnabled() {
		return
	}
	hits, misses, lookups := sc.Gauge(refLocalCacheHits), sc.Gauge(refLocalCacheMisses), sc.Gauge(refLocalCacheLookups)
	sc.AddGenerator(func() {
		h, m := c.CacheHits(), c.CacheMisses()
		hits.Set(h)
		misses.Set(m)
		lookups.Set(h + m)
	})
}
