package policy

import (
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// LoadOptions.Algorithms refuses every limit of another algorithm at its
// line, naming the rule and the backend; fixed windows (the default
// algorithm, and request overrides) load.
func TestLoadAlgorithmsSupported(t *testing.T) {
	opts := LoadOptions{Algorithms: []algo.Kind{algo.FixedWindow}, Backend: "memcache"}
	good := head + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n" +
		"  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window, calendar: false}\n"
	dir := writeFiles(t, map[string]string{"a.yaml": good})
	if _, _, err := Load(opts, dir); err != nil {
		t.Fatalf("fixed windows refused: %v", err)
	}
	bad := head +
		"  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n" +
		"  - key: tb\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: token_bucket\n" +
		"  - key: sw\n    rate_limits:\n      - {unit: minute, requests_per_unit: 5}\n      - {unit: hour, requests_per_unit: 50, algorithm: sliding_window}\n"
	dir = writeFiles(t, map[string]string{"a.yaml": bad})
	set, _, err := Load(opts, dir)
	if err == nil || set != nil {
		t.Fatalf("config with token_bucket and sliding_window loaded under a fixed-window-only backend")
	}
	msg := err.Error()
	for _, want := range []string{
		`a.yaml:9: descriptor "d.tb": algorithm token_bucket is not supported by the memcache backend (supported: fixed_window)`,
		`a.yaml:13: descriptor "d.sw": algorithm sliding_window is not supported by the memcache backend (supported: fixed_window)`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q\nlacks %q", msg, want)
		}
	}
	if n := strings.Count(msg, "not supported by the memcache backend"); n != 2 {
		t.Errorf("%d refusals, want 2:\n%s", n, msg)
	}
	// In-memory documents (xDS) are checked alike.
	if _, _, err := LoadSources(opts, Source{Name: "xds:mc", Data: []byte(bad)}); err == nil ||
		!strings.Contains(err.Error(), `xds:mc:9: descriptor "d.tb": algorithm token_bucket is not supported by the memcache backend`) {
		t.Errorf("LoadSources: %v, want the token_bucket refusal", err)
	}
	// Without Algorithms every algorithm loads.
	if _, _, err := Load(LoadOptions{}, dir); err != nil {
		t.Fatalf("without a backend restriction: %v", err)
	}
}
