package lease

import "github.com/prometheus/client_golang/prometheus"

// metrics are the lease metrics (nil Registerer: not registered, still
// counted). Labels are fixed words.
type metrics struct {
	renewals *prometheus.CounterVec
	granted  prometheus.Counter
	returned prometheus.Counter
	size     prometheus.Histogram
	local    *prometheus.CounterVec
	allowed  prometheus.Counter
	denied   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimitd_lease_renewals_total",
			Help: "Lease operations on the store by result: granted (all units asked for), short (fewer), empty (none left), returned (an idle or closing lease gave its units back), error."}, []string{"result"}),
		granted: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimitd_lease_granted_units_total",
			Help: "Units the store granted to this instance's leases."}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimitd_lease_returned_units_total",
			Help: "Units this instance's leases gave back to the store unused."}),
		size: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ratelimitd_lease_size_units",
			Help:    "Units granted per lease operation that asked for some.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		local: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimitd_lease_decisions_total",
			Help: "Hits of leased limits decided from this instance's leases, by result (allowed, denied)."}, []string{"result"}),
	}
	m.allowed, m.denied = m.local.WithLabelValues("allowed"), m.local.WithLabelValues("denied")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.renewals, m.granted, m.returned, m.size, m.local} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// renewed counts one lease operation.
func (m *metrics) renewed(result string, granted, returned int64) {
	m.renewals.WithLabelValues(result).Inc()
	if granted > 0 {
		m.granted.Add(float64(granted))
		m.size.Observe(float64(granted))
	}
	if returned > 0 {
		m.returned.Add(float64(returned))
	}
}

// decided counts local decisions.
func (m *metrics) decided(allowed, denied int) {
	if allowed > 0 {
		m.allowed.Add(float64(allowed))
	}
	if denied > 0 {
		m.denied.Add(float64(denied))
	}
}
