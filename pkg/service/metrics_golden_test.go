package service

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ratelimitd/ratelimitd/internal/golden"
)

// recordingRegisterer keeps every collector registered with it, in order.
type recordingRegisterer struct{ cs []prometheus.Collector }

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.cs = append(r.cs, c)
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	r.cs = append(r.cs, cs...)
}

func (r *recordingRegisterer) Unregister(prometheus.Collector) bool { return false }

// TestMetricsGolden pins the metrics the service registers: for each
// collector, in registration order, its Go type and the Desc of every
// metric it describes (name, help text, const and variable labels).
// Dashboards and alerts depend on these being byte-identical.
func TestMetricsGolden(t *testing.T) {
	reg := &recordingRegisterer{}
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range reg.cs {
		ch := make(chan *prometheus.Desc, 4)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			fmt.Fprintf(&b, "%T %s\n", c, d)
		}
	}
	got := b.String()
	golden.Check(t, filepath.Join("testdata", "metrics.golden"), []byte(got))
	if n := strings.Count(got, "\n"); n != 24 {
		t.Errorf("%d metrics registered, want 24", n)
	}
}
