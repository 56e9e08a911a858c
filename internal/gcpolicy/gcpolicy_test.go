package gcpolicy

import (
	"bytes"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"testing"
)

const mib = 1 << 20

// TestGCPolicyApply: apply changes exactly the settings that did not come
// from the environment, and Runtime reads them back.
func TestGCPolicyApply(t *testing.T) {
	p0, l0 := Runtime()
	t.Cleanup(func() { debug.SetGCPercent(p0); debug.SetMemoryLimit(l0) })
	debug.SetGCPercent(100)
	debug.SetMemoryLimit(math.MaxInt64)
	for _, c := range []struct {
		p            Policy
		wantPercent  int
		wantLimitRaw int64
	}{
		{Policy{Percent: 400, PercentSource: "flag", Limit: 400 * mib, LimitSource: "cgroup"}, 400, 400 * mib},
		{Policy{Percent: 250, PercentSource: "flag", Limit: 300 * mib, LimitSource: "flag"}, 250, 300 * mib},
		// From the environment: the runtime's own settings stay.
		{Policy{Percent: 50, PercentSource: "env", Limit: 10 * mib, LimitSource: "env"}, 250, 300 * mib},
		{Policy{Percent: -1, PercentSource: "flag", Limit: 200 * mib, LimitSource: "flag"}, -1, 200 * mib},
		{Policy{Percent: 100, PercentSource: "flag", Limit: math.MaxInt64, LimitSource: "none"}, 100, 200 * mib},
	} {
		c.p.Apply()
		if p, l := Runtime(); p != c.wantPercent || l != c.wantLimitRaw {
			t.Errorf("%+v: runtime has percent %d limit %d, want %d %d", c.p, p, l, c.wantPercent, c.wantLimitRaw)
		}
	}
}

// TestGCPolicyLog: the startup line gives each setting, its source and
// what set it, and GOGC=off without a memory limit is warned.
func TestGCPolicyLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	Policy{Percent: 400, PercentSource: "flag", PercentBy: "--gc-percent=400", Limit: 429496729, LimitSource: "cgroup", LimitBy: "--memory-limit-ratio=0.8", Cgroup: 512 * mib}.Log(log)
	Policy{Percent: 100, PercentSource: "env", PercentBy: "GOGC=100", Limit: math.MaxInt64, LimitSource: "none", LimitBy: "--memory-limit-ratio=0.8", CgroupNote: "the cgroup sets no memory limit"}.Log(log)
	Policy{Percent: -1, PercentSource: "env", Limit: math.MaxInt64, LimitSource: "none"}.Log(log) // GOGC=off alone: warned
	Policy{Percent: -1, PercentSource: "env", Limit: 200 * mib, LimitSource: "env"}.Log(log)      // with a limit: fine
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	for i, want := range [][]string{
		{"level=INFO", `msg="go gc policy"`, "gc_percent=400", "gc_percent_source=flag", `gc_percent_set_by="--gc-percent=400"`, "memory_limit=429496729", "memory_limit_bytes=429496729", "memory_limit_source=cgroup", `memory_limit_set_by="--memory-limit-ratio=0.8"`, "cgroup_memory_limit_bytes=536870912"},
		{"gc_percent=100", "gc_percent_source=env", `gc_percent_set_by="GOGC=100"`, "memory_limit=none", "memory_limit_source=none", `cgroup="the cgroup sets no memory limit"`},
		{"gc_percent=-1", "memory_limit=none"},
		{"level=WARN", "GOGC=off without a memory limit"},
		{"level=INFO", "gc_percent=-1", "memory_limit=200MiB"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %s", i, lines[i], w)
			}
		}
	}
}

// TestParseBytes: byte sizes parse in binary and decimal units, malformed
// or out-of-range ones are refused, --memory-limit has a floor, and
// FormatBytes prints the largest unit that is exact.
func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1": 1, "512": 512, "400MiB": 400 * mib, "400mib": 400 * mib, "400 MiB": 400 * mib, "512Mi": 512 * mib,
		"1GiB": 1 << 30, "1Gi": 1 << 30, "2TiB": 2 << 40, "3KiB": 3072, "3Ki": 3072, "1.5GiB": 3 << 29,
		"1KB": 1000, "1k": 1000, "400MB": 400e6, "2G": 2e9, "1TB": 1e12, "10B": 10, " 7 ": 7, "9223372036854775807": math.MaxInt64, "0.5KiB": 512,
	} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "-5MiB", "0.5", "0.9B", "1XB", "1.2.3", "1e3", "NaN", "99999999999TiB", "9223372036854775808", "8388608TiB", "10 iB", "0x10", "."} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
	var b ByteSize
	for in, want := range map[string]string{"400": "below 16MiB", "15MiB": "below 16MiB", "-5MiB": "negative", "0.5": "less than one byte"} {
		if err := b.Set(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--memory-limit=%s: %v, want an error with %q", in, err, want)
		}
	}
	for in, want := range map[string]ByteSize{"0": 0, "16MiB": 16 * mib, "400MiB": 400 * mib} {
		if err := b.Set(in); err != nil || b != want {
			t.Errorf("--memory-limit=%s: %d, %v; want %d", in, b, err, want)
		}
	}
	for n, want := range map[int64]string{0: "0", 1: "1", 1023: "1023", 1024: "1KiB", 400 * mib: "400MiB", 1 << 30: "1GiB", 1<<30 + 1: "1073741825", 5 << 40: "5TiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// FuzzParseBytes: a size ParseBytes accepts is non-negative and reads back
// exactly through FormatBytes.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"400MiB", "1.5GiB", "0", "512Mi", "1e3", "-1", "9223372036854775807", "99999999999TiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBytes(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseBytes(%q) = %d < 0", s, n)
		}
		// FormatBytes reads back exactly.
		if back, err := ParseBytes(FormatBytes(n)); err != nil || back != n {
			t.Fatalf("ParseBytes(FormatBytes(%d)) = %d, %v", n, back, err)
		}
	})
}
