package rlqs

import (
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the RLQS server's metrics; every label has a fixed set of
// values.
type metrics struct {
	streams     prometheus.Gauge
	assignments *prometheus.CounterVec // action: token_bucket, allow_all, deny_all, abandon
	errors      *prometheus.CounterVec // op: charge, demand
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ratelimitd_rlqs_streams",
			Help: "Open RLQS streams (one per Envoy and domain)."}),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimitd_rlqs_assignments_total",
			Help: "Bucket actions sent to Envoys over RLQS, by action."}, []string{"action"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimitd_rlqs_store_errors_total",
			Help: "RLQS rounds whose usage charge or demand sharing failed, by operation."}, []string{"op"}),
	}
	for _, a := range []string{"token_bucket", "allow_all", "deny_all", "abandon"} {
		m.assignments.WithLabelValues(a)
	}
	for _, op := range []string{"charge", "demand"} {
		m.errors.WithLabelValues(op)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.streams, m.assignments, m.errors} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// count counts one assignment by its strategy.
func (m *metrics) count(st *typev3.RateLimitStrategy) {
	switch {
	case st.GetTokenBucket() != nil:
		m.assignments.WithLabelValues("token_bucket").Inc()
	case st.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL:
		m.assignments.WithLabelValues("deny_all").Inc()
	default:
		m.assignments.WithLabelValues("allow_all").Inc()
	}
}
