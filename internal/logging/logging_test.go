package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLogDurations: durations are logged as Go duration strings in both
// formats, also inside groups; other kinds are untouched.
func TestLogDurations(t *testing.T) {
	var buf bytes.Buffer
	log := New("info", "json", &buf)
	log.Info("m", "timeout", 10*time.Millisecond, "n", 3, slog.Group("g", "grace", 90*time.Second), slog.Any("any", 2*time.Hour))
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	if rec["timeout"] != "10ms" || rec["n"] != float64(3) || rec["any"] != "2h0m0s" {
		t.Errorf("json: %s", buf.String())
	}
	if g, _ := rec["g"].(map[string]any); g == nil || g["grace"] != "1m30s" {
		t.Errorf("json group: %s", buf.String())
	}

	buf.Reset()
	New("info", "text", &buf).With("drain", 5*time.Second).Info("m", "timeout", 10*time.Millisecond, slog.Group("g", "grace", 90*time.Second))
	for _, want := range []string{" drain=5s ", " timeout=10ms ", " g.grace=1m30s"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("text: %q lacks %q", buf.String(), want)
		}
	}
}
