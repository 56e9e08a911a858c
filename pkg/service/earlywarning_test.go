package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const earlyWarningConfig = `domain: ew
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: tuned
    rate_limit: {unit: minute, requests_per_unit: 10, early_warning: {used: 0.8, within: 0.5}}
  - key: off
    rate_limit: {unit: minute, requests_per_unit: 10, early_warning: false}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket}
`

// TestEarlyWarning: ratelimitd_early_warning_total counts a key once when
// its usage crosses half of the limit within the first fifth of a fixed or
// sliding window (or the rule's own early_warning shares), never later in
// the window, never with early_warning: false or on a token bucket; many
// goroutines hitting the same keys count each key exactly once; the log
// line is sampled and names the key by hash only.
func TestEarlyWarning(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ew.yaml"), earlyWarningConfig)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &clock{now: start.Add(2 * time.Second)}
	reg := prometheus.NewRegistry()
	var logs syncBuffer
	opts := testOptions(c, newMemoryStore(t, c), reg)
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	svc := newService(t, opts, nil)
	svc.SetPolicy(loadSet(t, dir))
	ctx := context.Background()
	hit := func(key, value string, n int) {
		t.Helper()
		for range n {
			if _, err := svc.ShouldRateLimit(ctx, req("ew", d(key, value))); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(rule string) float64 {
		return metricValue(t, reg, "ratelimitd_early_warning_total", map[string]string{"domain": "ew", "rule": rule})
	}
	expect := func(step, rule string, want float64) {
		t.Helper()
		if got := count(rule); got != want {
			t.Errorf("%s: early warnings of %s = %v, want %v", step, rule, got, want)
		}
	}

	// 2 s into the window (before 12 s): the 6th request crosses 5.
	hit("fw", "a", 5)
	expect("5 of 10 used", "ew.fw", 0)
	hit("fw", "a", 1)
	expect("6 of 10 used", "ew.fw", 1)
	hit("fw", "a", 6) // up to 10, then denied: counted once per window
	expect("same key, same window", "ew.fw", 1)
	hit("sw", "a", 6)
	hit("off", "a", 10)
	hit("tb", "a", 10)
	hit("tuned", "a", 8) // 8 of 10 is not above 0.8
	expect("sliding window", "ew.sw", 1)
	expect("early_warning: false", "ew.off", 0)
	expect("token bucket", "ew.tb", 0)
	expect("tuned, 8 of 10", "ew.tuned", 0)

	// 29 s in: past a fifth, within the tuned half.
	c.Advance(27 * time.Second)
	hit("fw", "b", 10)
	hit("sw", "b", 10)
	hit("tuned", "b", 9)
	expect("fixed window at 29 s", "ew.fw", 1)
	expect("sliding window at 29 s", "ew.sw", 1)
	expect("tuned at 29 s", "ew.tuned", 1)

	// Next window, 1 s in: key a crosses again.
	c.Advance(32 * time.Second)
	hit("fw", "a", 6)
	expect("next window", "ew.fw", 2)

	// 40 goroutines on 8 fresh keys, 10 requests each (3 denied per key
	// beyond the limit of 10): each key crosses exactly once.
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for g := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 13 {
				if _, err := svc.ShouldRateLimit(ctx, req("ew", d("fw", fmt.Sprintf("k%d", g%8)))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	expect("8 keys from 40 goroutines", "ew.fw", 2+8)

	out := logs.String()
	if n := strings.Count(out, "early warning"); n < 1 || n > 4 {
		// One line per rule per second of the test clock: fw at 2 s,
		// sw at 2 s, tuned at 29 s, fw at 61 s; the 8 concurrent keys
		// fall in the second of fw's line.
		t.Errorf("%d early warning lines, want 1 to 4 (sampled):\n%s", n, out)
	}
	if !strings.Contains(out, "key_hash=") || strings.Contains(out, "fw") && strings.Contains(out, "k3") {
		t.Errorf("log lines must name keys by hash only:\n%s", out)
	}
}

const calendarEarlyWarningConfig = `domain: ew
descriptors:
  - key: fw
    rate_limit: {unit: month, requests_per_unit: 10, calendar: true}
  - key: sw
    rate_limit: {unit: month, requests_per_unit: 10, calendar: true, algorithm: sliding_window}
`

// TestEarlyWarningCalendar: on calendar months the first fifth of the
// window is a fifth of that month (5.6 days of February, 6.2 days of
// March), not of a nominal 30 days (6 days): 5 days 20 hours into February
// is too late, 6 days 2 hours into March is early, for fixed and sliding
// windows alike.
func TestEarlyWarningCalendar(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ew.yaml"), calendarEarlyWarningConfig)
	c := &clock{now: time.Date(2026, 2, 1, 2, 0, 0, 0, time.UTC)}
	reg := prometheus.NewRegistry()
	svc := newService(t, testOptions(c, newMemoryStore(t, c), reg), nil)
	svc.SetPolicy(loadSet(t, dir))
	ctx := context.Background()
	hit := func(key, value string, n int) {
		t.Helper()
		for range n {
			if _, err := svc.ShouldRateLimit(ctx, req("ew", d(key, value))); err != nil {
				t.Fatal(err)
			}
		}
	}
	expect := func(step string, want float64) {
		t.Helper()
		for _, rule := range []string{"ew.fw", "ew.sw"} {
			got := metricValue(t, reg, "ratelimitd_early_warning_total", map[string]string{"domain": "ew", "rule": rule})
			if got != want {
				t.Errorf("%s: early warnings of %s = %v, want %v", step, rule, got, want)
			}
		}
	}
	for _, k := range []string{"fw", "sw"} {
		hit(k, "a", 6)
	}
	expect("2 hours into February", 1)

	c.Advance(5*24*time.Hour + 18*time.Hour) // February 6, 20:00
	for _, k := range []string{"fw", "sw"} {
		hit(k, "b", 6)
	}
	expect("5 days 20 hours into February (a fifth is 5.6 days)", 1)

	c.Advance(time.Date(2026, 3, 7, 2, 0, 0, 0, time.UTC).Sub(c.Now()))
	for _, k := range []string{"fw", "sw"} {
		hit(k, "c", 6)
	}
	expect("6 days 2 hours into March (a fifth is 6.2 days)", 2)

	c.Advance(4 * time.Hour)
	for _, k := range []string{"fw", "sw"} {
		hit(k, "d", 6)
	}
	expect("6 days 6 hours into March", 2)
}
