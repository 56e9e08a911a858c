package stats

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeDurable struct {
	state   string
	healthy bool
}

func (f *fakeDurable) Stats() Stats {
	return Stats{Has: Durable, BreakerState: f.state, Healthy: f.healthy, Swept: 7, SweepErrors: 2}
}

// TestDurableMetrics: the durable store's breaker state, health and
// sweeper counts are exported and follow the store; a store that is not
// durable exports nothing.
func TestDurableMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := &fakeDurable{state: "closed", healthy: true}
	if err := RegisterDurable(reg, f.Stats); err != nil {
		t.Fatal(err)
	}
	state := func() map[string]float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "ratelimitd_durable_circuit_state" {
				continue
			}
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	if got := state(); got["closed"] != 1 || got["open"] != 0 || got["half_open"] != 0 {
		t.Errorf("circuit state %v, want closed", got)
	}
	if got := gaugeValue(t, reg, "ratelimitd_durable_healthy"); got != 1 {
		t.Errorf("healthy %v, want 1", got)
	}
	f.state, f.healthy = "open", false
	if got := state(); got["open"] != 1 || got["closed"] != 0 {
		t.Errorf("circuit state %v, want open", got)
	}
	if got := gaugeValue(t, reg, "ratelimitd_durable_healthy"); got != 0 {
		t.Errorf("healthy %v with the store down, want 0", got)
	}
	if got := testutil.ToFloat64(mustCollector(t, reg, "ratelimitd_durable_swept_rows_total")); got != 7 {
		t.Errorf("swept %v, want 7", got)
	}
	if got := testutil.ToFloat64(mustCollector(t, reg, "ratelimitd_durable_sweep_errors_total")); got != 2 {
		t.Errorf("sweep errors %v, want 2", got)
	}
	empty := prometheus.NewRegistry()
	if err := RegisterDurable(empty, (&fakeBackend{state: "closed"}).Stats); err != nil {
		t.Fatal(err)
	}
	if mfs, _ := empty.Gather(); len(mfs) != 0 {
		t.Errorf("a store that is not durable exported %d metrics", len(mfs))
	}
}

// gaugeValue is the value of the gauge name (one series) in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not exported", name)
	return 0
}
