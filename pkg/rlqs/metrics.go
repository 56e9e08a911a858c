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
	errors      *prometheus.CounterVec // op: charge, charge_durable, demand, demand_join, read_join, reserve, reserve_join
	overBound   *prometheus.CounterVec // action: deny_all, allow_all
	dropped     *prometheus.CounterVec // reason: bucket_bound, store
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ratelimitd_rlqs_streams",
			Help: "Open RLQS streams (one per Envoy and domain)."}),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimitd_rlqs_assignments_total",
			Help: "Bucket actions sent to Envoys over RLQS, by action."}, []string{"action"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimitd_rlqs_store_errors_total",
			Help: "RLQS store calls that failed or were not made for want of time, by operation: charge (usage on the backend), charge_durable (usage on the durable store), demand (a round's demand sharing), demand_join (a new bucket's demand sharing, within 20 ms), read_join (the remaining budget of a new bucket's hour, day or other window longer than the assignment TTL on the backend, within 20 ms), reserve (a round's lease of its assignments on the backend), reserve_join (a new bucket's, within 20 ms); each call is at most 128 counters."}, []string{"op"}),
		overBound: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimitd_rlqs_buckets_over_bound_total",
			Help: "Bucket reports past --rlqs-max-buckets-per-stream, not tracked nor charged, by the action answered: deny_all (a limited rule), allow_all (a rule that never denies)."}, []string{"action"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimitd_rlqs_usage_dropped_total",
			Help: "Requests Envoys reported as allowed that were never charged, by reason: bucket_bound (a bucket past --rlqs-max-buckets-per-stream), store (the store failed the charge 3 rounds in a row, or it went uncharged 30 rounds in a row for want of time)."}, []string{"reason"}),
	}
	for _, a := range []string{"token_bucket", "allow_all", "deny_all", "abandon"} {
		m.assignments.WithLabelValues(a)
	}
	for _, op := range []string{"charge", "charge_durable", "demand", "demand_join", "read_join", "reserve", "reserve_join"} {
		m.errors.WithLabelValues(op)
	}
	for _, a := range []string{"deny_all", "allow_all"} {
		m.overBound.WithLabelValues(a)
	}
	for _, r := range []string{"bucket_bound", "store"} {
		m.dropped.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.streams, m.assignments, m.errors, m.overBound, m.dropped} {
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
