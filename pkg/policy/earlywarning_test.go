package policy

import (
	"testing"
)

// TestEarlyWarningConfig: early_warning defaults to 0.5 of the limit within
// 0.2 of the window on fixed and sliding windows, takes a mapping, turns off
// with false, and is off for the other algorithms.
func TestEarlyWarningConfig(t *testing.T) {
	set, _, errs := loadOne(t, `domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tuned
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window, early_warning: {used: 0.8, within: 0.1}}
  - key: off
    rate_limit: {unit: minute, requests_per_unit: 10, early_warning: false}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket}
`)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := map[string]EarlyWarning{"d.plain": DefaultEarlyWarning, "d.tuned": {Used: 0.8, Within: 0.1}, "d.off": {}, "d.bucket": {}}
	for _, r := range set.Rules() {
		if got := r.Limits[0].EarlyWarning; got != want[r.Path] {
			t.Errorf("%s: early warning %+v, want %+v", r.Path, got, want[r.Path])
		}
		delete(want, r.Path)
	}
	if len(want) > 0 {
		t.Errorf("rules missing: %v", want)
	}
}
