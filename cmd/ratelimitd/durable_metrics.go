package main

import "github.com/prometheus/client_golang/prometheus"

// durableStore is what the durable store (pkg/backend/postgres) reports
// about itself for its metrics.
type durableStore interface {
	BreakerState() string
	Healthy() bool
	Swept() uint64
	SweepErrors() uint64
}

// registerDurableMetrics exports the durable store's state beside the
// backend's own (registerBackendMetrics): its circuit breaker state (one
// series per state, 1 for the current one), whether it counts decisions
// now, and its sweeper's deleted rows and failed batches. A store
// without these methods (no durable store configured) exports nothing.
func registerDurableMetrics(reg prometheus.Registerer, store any) error {
	d, ok := store.(durableStore)
	if !ok {
		return nil
	}
	var cs []prometheus.Collector
	for _, st := range breakerStates {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "ratelimitd_durable_circuit_state",
			Help:        "Circuit breaker in front of the durable store (PostgreSQL): 1 for the current state (closed, open, half_open), else 0.",
			ConstLabels: prometheus.Labels{"state": st},
		}, func() float64 {
			if d.BreakerState() == st {
				return 1
			}
			return 0
		}))
	}
	cs = append(cs,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimitd_durable_healthy",
			Help: "1 while the durable store (PostgreSQL) counts decisions, 0 from an outage error until a decision or its probe succeeds again.",
		}, func() float64 {
			if d.Healthy() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimitd_durable_swept_rows_total",
			Help: "Expired rows of the durable store deleted by its sweeper.",
		}, func() float64 { return float64(d.Swept()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimitd_durable_sweep_errors_total",
			Help: "Sweeper batches of the durable store that failed (retried at the next sweep; expired rows stay meanwhile, harmless).",
		}, func() float64 { return float64(d.SweepErrors()) }),
	)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
