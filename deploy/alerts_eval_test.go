package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	promqlengine "github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// sample is one float sample of a test series.
type sample struct {
	t int64
	f float64
}

func (s sample) T() int64                      { return s.t }
func (s sample) ST() int64                     { return 0 }
func (s sample) F() float64                    { return s.f }
func (s sample) H() *histogram.Histogram       { return nil }
func (s sample) FH() *histogram.FloatHistogram { return nil }
func (s sample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s sample) Copy() chunks.Sample           { return s }

// seriesSet iterates a fixed list of series.
type seriesSet struct {
	s []storage.Series
	i int
}

func (s *seriesSet) Next() bool                        { s.i++; return s.i <= len(s.s) }
func (s *seriesSet) At() storage.Series                { return s.s[s.i-1] }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

// counters is an in-memory storage of counters growing linearly: one
// sample a minute for 20 minutes.
func counters(perMinute map[string]float64) storage.Queryable {
	var all []storage.Series
	for spec, rate := range perMinute {
		name, rest, _ := strings.Cut(spec, "{")
		kv := []string{model.MetricNameLabel, name}
		for _, p := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
			k, v, _ := strings.Cut(p, "=")
			kv = append(kv, k, strings.Trim(v, `"`))
		}
		var ss []chunks.Sample
		for m := range 21 {
			ss = append(ss, sample{t: int64(m) * 60_000, f: rate * float64(m)})
		}
		all = append(all, storage.NewListSeries(labels.FromStrings(kv...), ss))
	}
	return storage.QueryableFunc(func(_, _ int64) (storage.Querier, error) {
		return &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			var out []storage.Series
		next:
			for _, s := range all {
				for _, m := range ms {
					if !m.Matches(s.Labels().Get(m.Name)) {
						continue next
					}
				}
				out = append(out, s)
			}
			return &seriesSet{s: out}
		}}, nil
	})
}

func alertExpr(t *testing.T, alert string) string {
	t.Helper()
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				return r.Expr
			}
		}
	}
	t.Fatalf("no alert %s in %s", alert, rulesFile)
	return ""
}

// TestAlertsEvaluate runs the per-rule denial and early-warning alerts
// (with the thresholds the file ships, which are the chart's defaults) in
// Prometheus' own engine: a rule denying a third of its decisions fires;
// one denying 5 %, or one too quiet to matter, does not; a rule with 5
// early warnings a minute fires, one with 0.5 does not.
func TestAlertsEvaluate(t *testing.T) {
	const lbl = `namespace="n",job="j",domain="d"`
	st := counters(map[string]float64{
		`ratelimitd_decisions_total{` + lbl + `,rule="d.a",result="ok"}`:         60,
		`ratelimitd_decisions_total{` + lbl + `,rule="d.a",result="over_limit"}`: 30,
		`ratelimitd_decisions_total{` + lbl + `,rule="d.b",result="ok"}`:         60,
		`ratelimitd_decisions_total{` + lbl + `,rule="d.b",result="over_limit"}`: 3,
		`ratelimitd_decisions_total{` + lbl + `,rule="d.c",result="ok"}`:         1,
		`ratelimitd_decisions_total{` + lbl + `,rule="d.c",result="over_limit"}`: 2,
		`ratelimitd_early_warning_total{` + lbl + `,rule="d.a"}`:                 5,
		`ratelimitd_early_warning_total{` + lbl + `,rule="d.b"}`:                 0.5,
	})
	eng := promqlengine.NewEngine(promqlengine.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	for _, tc := range []struct {
		alert string
		want  map[string]float64 // rule -> value
	}{
		{"RatelimitdRuleSustainedDenials", map[string]float64{"d.a": 1.0 / 3}},
		{"RatelimitdEarlyWarnings", map[string]float64{"d.a": 5}},
	} {
		q, err := eng.NewInstantQuery(context.Background(), st, nil, alertExpr(t, tc.alert), time.Unix(15*60, 0))
		if err != nil {
			t.Fatalf("%s: %v", tc.alert, err)
		}
		res := q.Exec(context.Background())
		vec, err := res.Vector()
		if err != nil {
			t.Fatalf("%s: %v", tc.alert, err)
		}
		got := map[string]float64{}
		for _, s := range vec {
			got[s.Metric.Get("rule")] = s.F
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s fires for %v, want %v", tc.alert, got, tc.want)
		}
		for r, v := range tc.want {
			if g, ok := got[r]; !ok || g < v*0.999 || g > v*1.001 {
				t.Errorf("%s: rule %s value %v (fires: %v), want %v", tc.alert, r, g, ok, v)
			}
		}
		q.Close()
	}
}
