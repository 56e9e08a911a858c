package testproc

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// MetricSum is the sum over the series of the metric family name in g
// whose labels include every pair of want (every series when want is
// empty) of their sample (see sample); 0 when there is none.
func MetricSum(g prometheus.Gatherer, name string, want map[string]string) (float64, error) {
	return metricSeries(g, name, want, false)
}

// MetricValue is the sample (see sample) of the series of the metric
// family name in g whose labels are exactly labels (no label more; nil
// for a metric without labels); 0 when there is none.
func MetricValue(g prometheus.Gatherer, name string, labels map[string]string) (float64, error) {
	return metricSeries(g, name, labels, true)
}

// metricSeries sums the samples of name's series that carry every pair of
// want, and, when exact, no other label.
func metricSeries(g prometheus.Gatherer, name string, want map[string]string, exact bool) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, want) && (!exact || len(m.GetLabel()) == len(want)) {
				sum += sample(m)
			}
		}
	}
	return sum, nil
}

// sample is the value of a counter, gauge or untyped series; of a
// histogram or summary, its sample count.
func sample(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	case m.Summary != nil:
		return float64(m.GetSummary().GetSampleCount())
	}
	return 0
}

// hasLabels reports whether m carries every label pair of want.
func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
