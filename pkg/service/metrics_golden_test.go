package service

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

var updateMetricsGolden = flag.Bool("update-metrics-golden", false, "rewrite testdata/metrics.golden from the metrics newMetrics registers")

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
	path := filepath.Join("testdata", "metrics.golden")
	if *updateMetricsGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("registered metrics differ from %s (-want +got):\n%s", path, diff)
	}
	if n := strings.Count(got, "\n"); n != 16 {
		t.Errorf("%d metrics registered, want 16", n)
	}
}
