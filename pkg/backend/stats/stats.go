// Package stats holds a backend store's figures for metrics (Stats, which
// each store returns from its Stats method) and registers the metrics made
// from them, so that stores of one kind export the same names, labels and
// help.
package stats

import "github.com/prometheus/client_golang/prometheus"

// Has says which figures of Stats a store reports; a metric whose figure
// the store lacks is not registered.
type Has uint32

// The figures of Stats.
const (
	Breaker        Has = 1 << iota // BreakerState
	CacheHits                      // CacheHits
	Cache                          // CacheEnabled, CacheHits and CacheMisses
	ClusterRefunds                 // ClusterRefundErrors
	Credits                        // CacheEnabled, CreditsLive and CreditPublishErrors
	MasterChanges                  // MasterChanges
	RefundFailures                 // RefundFailures
	FullHits                       // Sketched and Refused
	Durable                        // BreakerState, Healthy, Swept and SweepErrors
)

// Stats are a store's figures, read at every scrape. Counters count since
// the store was created.
type Stats struct {
	Has                 Has    // the figures the store reports
	BreakerState        string // the circuit: "closed", "open" or "half_open"
	CacheEnabled        bool   // the local over-limit cache is on
	CacheHits           uint64 // cache lookups that found a denial
	CacheMisses         uint64 // cache lookups that found none
	ClusterRefundErrors uint64 // Redis Cluster compensating refunds that failed
	RefundFailures      uint64 // memcached refunds that failed
	CreditsLive         bool   // the Redis credit channel's subscription is confirmed
	CreditPublishErrors uint64 // refunds and resets the credit channel did not carry
	MasterChanges       uint64 // address changes of the Sentinel master
	Sketched            uint64 // new keys' hits a full in-memory store decided by its sketch
	Refused             uint64 // new keys' hits a full in-memory store denied
	Healthy             bool   // the durable store counts decisions
	Swept               uint64 // expired rows the durable store's sweeper deleted
	SweepErrors         uint64 // sweeper batches that failed
}

// breakerStates are the values of the state label of the circuit gauges.
var breakerStates = []string{"closed", "open", "half_open"}

// RegisterBackend registers the metrics of the backend store whose
// figures stats reads (read once here for Has and CacheEnabled).
func RegisterBackend(reg prometheus.Registerer, stats func() Stats) error {
	first := stats()
	var cs []prometheus.Collector
	counter := func(name, help string, v func(Stats) uint64) {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(stats())) }))
	}
	if first.Has&Breaker != 0 {
		cs = append(cs, circuitGauges("ratelimitd_backend_circuit_state",
			"Circuit breaker in front of the backend: 1 for the current state (closed, open, half_open), else 0.", stats)...)
	}
	if first.Has&(CacheHits|Cache) != 0 {
		counter("ratelimitd_local_cache_hits_total",
			"Local over-limit cache lookups that found a denial (one lookup per cacheable hit of a request).", func(s Stats) uint64 { return s.CacheHits })
	}
	if first.Has&Cache != 0 {
		counter("ratelimitd_local_cache_misses_total",
			"Local over-limit cache lookups that found no denial (no entry, an expired one, or a smaller cost than the one cached).", func(s Stats) uint64 { return s.CacheMisses })
	}
	if first.Has&ClusterRefunds != 0 {
		counter("ratelimitd_cluster_refund_errors_total",
			"Redis Cluster compensating refunds that failed (a slot group that allowed could not be undone after another denied).", func(s Stats) uint64 { return s.ClusterRefundErrors })
	}
	if first.Has&Credits != 0 {
		counter("ratelimitd_credit_publish_errors_total",
			"Refunds and resets whose keys could not be published on the Redis credit channel: other instances may deny those keys until their cached retry time.", func(s Stats) uint64 { return s.CreditPublishErrors })
		if first.CacheEnabled {
			cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "ratelimitd_local_cache_live",
				Help: "1 while the local over-limit cache answers (its subscription to the Redis credit channel is confirmed), 0 while it is flushed and waits for it.",
			}, func() float64 { return one(stats().CreditsLive) }))
		}
	}
	if first.Has&MasterChanges != 0 {
		counter("ratelimitd_backend_master_changes_total",
			"Times the Redis Sentinel master the store writes to changed address (failovers; 0 outside Sentinel mode).", func(s Stats) uint64 { return s.MasterChanges })
	}
	if first.Has&RefundFailures != 0 {
		counter("ratelimitd_backend_refund_errors_total",
			"memcached refunds (DECR of a denied or failed request's increments) that failed; each leaves those units counted until the window ends.", func(s Stats) uint64 { return s.RefundFailures })
	}
	return register(reg, cs)
}

// RegisterMemory registers the full-store hits of an in-memory store, the
// backend or the fallback (store), when it reports them.
func RegisterMemory(reg prometheus.Registerer, store string, stats func() Stats) error {
	if stats().Has&FullHits == 0 {
		return nil
	}
	var cs []prometheus.Collector
	for _, d := range []string{"sketched", "refused"} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ratelimitd_memory_full_hits_total",
			Help:        "Hits of new keys a full in-memory store had no slot for: decided by its sketch (sketched), or denied (refused: sliding log and concurrency).",
			ConstLabels: prometheus.Labels{"store": store, "decision": d},
		}, func() float64 {
			s := stats()
			if d == "sketched" {
				return float64(s.Sketched)
			}
			return float64(s.Refused)
		}))
	}
	return register(reg, cs)
}

// RegisterDurable registers the metrics of the durable store (PostgreSQL),
// when it reports them.
func RegisterDurable(reg prometheus.Registerer, stats func() Stats) error {
	if stats().Has&Durable == 0 {
		return nil
	}
	cs := circuitGauges("ratelimitd_durable_circuit_state",
		"Circuit breaker in front of the durable store (PostgreSQL): 1 for the current state (closed, open, half_open), else 0.", stats)
	cs = append(cs,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimitd_durable_healthy",
			Help: "1 while the durable store (PostgreSQL) counts decisions, 0 from an outage error until a decision or its probe succeeds again.",
		}, func() float64 { return one(stats().Healthy) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimitd_durable_swept_rows_total",
			Help: "Expired rows of the durable store deleted by its sweeper.",
		}, func() float64 { return float64(stats().Swept) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimitd_durable_sweep_errors_total",
			Help: "Sweeper batches of the durable store that failed (retried at the next sweep; expired rows stay meanwhile, harmless).",
		}, func() float64 { return float64(stats().SweepErrors) }),
	)
	return register(reg, cs)
}

// circuitGauges are one gauge per breaker state, 1 for the current one.
func circuitGauges(name, help string, stats func() Stats) []prometheus.Collector {
	var cs []prometheus.Collector
	for _, st := range breakerStates {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: name, Help: help, ConstLabels: prometheus.Labels{"state": st},
		}, func() float64 { return one(stats().BreakerState == st) }))
	}
	return cs
}

func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func register(reg prometheus.Registerer, cs []prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
