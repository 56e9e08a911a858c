package service_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// TestDetailedMetricCapHoldsAcrossReloads: the detailed_metric label budget
// is the process's. Configs that differ (a comment each) and new request
// values after each reload never take ratelimitd_decisions_total past
// DetailedMetricCap distinct rule labels plus _other.
func TestDetailedMetricCapHoldsAcrossReloads(t *testing.T) {
	const capN = 30
	e := newEnv(t, func(o *service.Options) { o.DetailedMetricCap = capN })
	dir := t.TempDir()
	for round := range 4 {
		path := filepath.Join(dir, fmt.Sprintf("m%d.yaml", round))
		body := fmt.Sprintf("# edit %d\ndomain: m\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 3}\n", round)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		set, _, err := policy.Load(policy.LoadOptions{}, path)
		if err != nil {
			t.Fatal(err)
		}
		e.svc.SetPolicy(set)
		for i := range 2 * capN {
			if _, err := e.svc.ShouldRateLimit(context.Background(), req("m", d("user", fmt.Sprintf("r%d-u%d", round, i)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimitd_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" {
					rules[l.GetValue()] = true
				}
			}
		}
	}
	if !rules[service.LabelOther] || len(rules) != capN+1 {
		t.Errorf("%d distinct rule labels (with _other: %t) after 4 configs of %d new values each, want %d values and _other", len(rules), rules[service.LabelOther], 2*capN, capN)
	}
}
