package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// rulesConfig is a config of one domain with n rules (n descriptor values
// of one key, each with its own limit).
func rulesConfig(domain string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for i := range n {
		fmt.Fprintf(&b, "  - key: user\n    value: user-%d\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n", i, i+1)
	}
	return b.String()
}

func TestLoadMaxRules(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(p, []byte(rulesConfig("big", 11)), 0o644); err != nil {
		t.Fatal(err)
	}
	s, _, err := Load(LoadOptions{MaxRules: 10}, p)
	if err == nil || s != nil {
		t.Fatalf("Load with 11 rules, MaxRules 10: set %v, err %v; want a refusal", s, err)
	}
	if want := "config: config too large: 11 rules, more than the limit of 10 (--max-config-rules)"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
	if IsReadError(err) {
		t.Fatalf("a too-large config is a rejected config, not a read error: %v", err)
	}
	for _, max := range []int{0, 11} {
		s, _, err := Load(LoadOptions{MaxRules: max}, p)
		if err != nil || len(s.Rules()) != 11 {
			t.Fatalf("MaxRules %d: %d rules, err %v; want 11 rules", max, len(s.Rules()), err)
		}
	}
}

func TestLoadMaxBytes(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	ca, cb := rulesConfig("a", 3), rulesConfig("b", 3)
	if err := os.WriteFile(a, []byte(ca), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte(cb), 0o644); err != nil {
		t.Fatal(err)
	}
	all := int64(len(ca) + len(cb))
	for _, max := range []int64{0, all} {
		if s, _, err := Load(LoadOptions{MaxBytes: max}, dir); err != nil || len(s.Rules()) != 6 {
			t.Fatalf("MaxBytes %d (config of %d bytes): err %v", max, all, err)
		}
	}
	s, _, err := Load(LoadOptions{MaxBytes: all - 1}, dir)
	if err == nil || s != nil {
		t.Fatalf("MaxBytes %d, config of %d bytes: set %v, err %v; want a refusal", all-1, all, s, err)
	}
	want := fmt.Sprintf("config: config too large: more than the limit of %d bytes (--max-config-bytes) at %s", all-1, b)
	if !strings.Contains(err.Error(), want) || IsReadError(err) {
		t.Fatalf("error %q: want a config error containing %q", err, want)
	}
}

// BenchmarkLoadMemory10kRules reports the heap a loaded Set of 10,000 rules
// keeps (heap-bytes-per-10k-rules, live after a GC, with the file's bytes
// and parse tree gone) and what one load allocates in all (B/op).
func BenchmarkLoadMemory10kRules(b *testing.B) {
	dir := b.TempDir()
	p := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(p, []byte(rulesConfig("big", 10000)), 0o644); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var live uint64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s, _, err := Load(LoadOptions{}, p)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if n := len(s.Rules()); n != 10000 {
			b.Fatalf("%d rules", n)
		}
		live = after.HeapAlloc - before.HeapAlloc
		runtime.KeepAlive(s)
	}
	b.ReportMetric(float64(live), "heap-bytes-per-10k-rules")
	if st, err := os.Stat(p); err == nil {
		b.ReportMetric(float64(st.Size()), "config-bytes")
	}
}
