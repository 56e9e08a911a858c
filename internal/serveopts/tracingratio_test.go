package serveopts

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/telemetry"
)

// TestTracingSampleRatioFlag: --tracing-sample-ratio=0 samples no root
// span (telemetry.NeverSample), a ratio in (0, 1] is passed as it is, and
// a negative one is refused rather than read as NeverSample.
func TestTracingSampleRatioFlag(t *testing.T) {
	for _, c := range []struct {
		flag  float64
		want  float64
		valid bool
	}{
		{0, telemetry.NeverSample, true},
		{0.25, 0.25, true},
		{1, 1, true},
		{-1, 0, false},
		{2, 2, false},
	} {
		o := Defaults()
		o.Telemetry.SampleRatio = c.flag
		got := TelemetryOptions(o)
		if err := got.Validate(); (err == nil) != c.valid {
			t.Errorf("--tracing-sample-ratio=%v: Validate %v, want valid %v", c.flag, err, c.valid)
		}
		if c.valid && got.SampleRatio != c.want {
			t.Errorf("--tracing-sample-ratio=%v: SampleRatio %v, want %v", c.flag, got.SampleRatio, c.want)
		}
	}
}
