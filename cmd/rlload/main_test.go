package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseCPU(t *testing.T) {
	page := "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n" +
		"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\nother 1\n"
	got, err := parseCPU(strings.NewReader(page))
	if err != nil || got != 12.5 {
		t.Fatalf("parseCPU = %v, %v; want 12.5", got, err)
	}
	if _, err := parseCPU(strings.NewReader("x 1\n")); err == nil {
		t.Fatal("parseCPU without the metric: want error")
	}
}

func TestPct(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Microsecond)
	}
	if got := pct(d, 0.5); got != 50 {
		t.Errorf("p50 = %v, want 50", got)
	}
	if got := pct(d, 0.99); got != 99 {
		t.Errorf("p99 = %v, want 99", got)
	}
	if got := pct(nil, 0.99); got != 0 {
		t.Errorf("p99 of nothing = %v, want 0", got)
	}
}
