package service_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// TestDetailedMetricValuesInLabels pins what docs/metrics.md and
// docs/security.md say: a detailed_metric rule puts the request's value,
// not hashed, into the rule label (as envoyproxy/ratelimit's stat names
// do), and with detailed labels disabled (--detailed-metric-cap=-1) no
// label of any metric carries it.
func TestDetailedMetricValuesInLabels(t *testing.T) {
	const secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
	for _, disabled := range []bool{false, true} {
		e := newCodecEnv(t, true, func(o *service.Options) { o.DisableDetailedMetrics = disabled })
		if _, err := e.svc.ShouldRateLimit(context.Background(), req("svc", d("detailed", secret))); err != nil {
			t.Fatal(err)
		}
		mfs, err := e.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					found = found || strings.Contains(l.GetValue(), secret)
				}
			}
		}
		if found == disabled {
			t.Errorf("detailed labels disabled=%t: request value in a label = %t, want %t", disabled, found, !disabled)
		}
	}
}
