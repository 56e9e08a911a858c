package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

const penaltyConfig = `domain: d
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 10}
    penalty: {after: 3, within: 1h, block: 5m}
  - key: sticky
    rate_limit: {unit: second, requests_per_unit: 1}
    penalty: {after: 1, within: 10s, block: 30s, extend: true}
`

// TestPenaltyLoad: penalty compiles into Rule.Penalty with the names as
// written.
func TestPenaltyLoad(t *testing.T) {
	s := loadYAML(t, penaltyConfig)
	got := map[string]algo.Penalty{}
	for _, r := range s.Rules() {
		got[r.Path] = r.Penalty
	}
	want := map[string]algo.Penalty{
		"d.client": {After: 3, Within: time.Hour, Block: 5 * time.Minute},
		"d.sticky": {After: 1, Within: 10 * time.Second, Block: 30 * time.Second, Extend: true},
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: penalty %+v, want %+v", k, got[k], w)
		}
	}
}

// TestPenaltyRefused: bad penalties are refused at their line, and a
// backend that cannot decide a penalty box (NoPenalty) refuses every
// `penalty:` at its line, naming the backend.
func TestPenaltyRefused(t *testing.T) {
	for _, tc := range []struct{ penalty, want string }{
		{"{after: 0, within: 1h, block: 5m}", "t.yaml:4: penalty after must be at least 1"},
		{"{after: 3, within: 1h}", "t.yaml:4: penalty needs after, within and block"},
		{"{after: 3, within: 1x, block: 5m}", `t.yaml:4: penalty within must be a duration`},
		{"{after: 3, within: 1h, block: -5m}", `t.yaml:4: penalty block must be a duration`},
		{"{after: 3, within: 1h, block: 5m, blok: 1}", `t.yaml:4: unknown key "blok" in penalty`},
		{"3", "t.yaml:4: penalty must be a mapping"},
	} {
		yml := "domain: d\ndescriptors:\n  - key: k\n    penalty: " + tc.penalty + "\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
		_, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(yml)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("penalty %s: error %v, want %q", tc.penalty, err, tc.want)
		}
	}
	opts := LoadOptions{Algorithms: []algo.Kind{algo.FixedWindow}, Backend: "memcache", NoPenalty: true}
	_, _, err := LoadSources(opts, Source{Name: "t.yaml", Data: []byte(penaltyConfig)})
	if err == nil {
		t.Fatal("penalty loaded on a backend without penalty boxes")
	}
	for _, want := range []string{
		`t.yaml:5: descriptor "d.client": penalty is not supported by the memcache backend`,
		`t.yaml:8: descriptor "d.sticky": penalty is not supported by the memcache backend`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\nlacks %q", err, want)
		}
	}
}
