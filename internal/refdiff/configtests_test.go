package refdiff

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

// The reference's own config tests (its test/config) load files of that
// directory and ask its config for the limit of descriptors; the tests
// here send the same descriptors to both servers loaded with the same
// files, and compare the answers and the statsd stats each server sends
// for them: the per-key hit stats (ratelimit.service.rate_limit.<key>.*)
// and the config load counters (ratelimit.service.config_load_*).

// configTestDir is where the reference keeps its config tests' files.
const configTestDir = "test/config"

// configTestFile reads one file of the reference's config tests.
func configTestFile(t *testing.T, name string) string {
	t.Helper()
	_, _, src := builds(t)
	b, err := os.ReadFile(filepath.Join(src, configTestDir, name))
	if err != nil {
		t.Fatalf("the reference's config test file: %v", err)
	}
	return string(b)
}

// statsFlush is STATS_FLUSH_INTERVAL for the stats tests: both servers
// send their counters this often.
const statsFlush = "STATS_FLUSH_INTERVAL=200ms"

// comparedStat reports whether a statsd name is one the stats tests
// compare: the per-key hit stats and domain_not_found (except those of
// the harness' readiness probe, whose count depends on how long a server
// took to start) and the config load counters.
func comparedStat(name string) bool {
	if strings.Contains(name, "refdiff-probe-no-such-domain") {
		return false
	}
	return strings.HasPrefix(name, "ratelimit.service.rate_limit.") || strings.HasPrefix(name, "ratelimit.service.config_load_")
}

// compareStats waits until both sinks received marker and the same
// compared stats (comparedStat, counters summed over every flush), and
// fails t with the difference when they still differ after 30 s. Both
// servers count a request's stats before they answer it and send every
// counter at each flush, so once the marker, counted after every other
// request, arrived, the stats of those requests arrived or are in the
// next flush.
func compareStats(t *testing.T, refSink, ourSink *testproc.StatsdSink, marker string) {
	t.Helper()
	pick := func(s *testproc.StatsdSink) (map[string]float64, bool) {
		all, _ := s.Totals()
		out := map[string]float64{}
		for k, v := range all {
			if name := strings.TrimSuffix(k, "|c"); name != k && comparedStat(name) {
				out[name] = v
			}
		}
		_, ok := out[marker]
		return out, ok
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ref, refOK := pick(refSink)
		ours, ourOK := pick(ourSink)
		diff := statsDiff(ref, ours)
		if refOK && ourOK && diff == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("statsd stats differ after 30s (marker %s: reference %t, ratelimitd %t):\n%s", marker, refOK, ourOK, diff)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// statsDiff lists every compared stat whose totals differ, one per line.
func statsDiff(ref, ours map[string]float64) string {
	var names []string
	for k := range ref {
		names = append(names, k)
	}
	for k := range ours {
		if _, ok := ref[k]; !ok {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		r, rok := ref[k]
		o, ook := ours[k]
		if r != o || rok != ook {
			fmt.Fprintf(&b, "  %s: reference %s, ratelimitd %s\n", k, statValue(r, rok), statValue(o, ook))
		}
	}
	return b.String()
}

func statValue(v float64, ok bool) string {
	if !ok {
		return "never sent"
	}
	return fmt.Sprint(v)
}

// validateAs runs `ratelimitd validate args...` with the pair's
// environment (the reference's variables) and returns its exit code and
// output.
func (p *pair) validateAs(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(p.ourBin, append([]string{"validate"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, p.env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	}
	t.Fatalf("validate: %v", err)
	return 0, ""
}

// noEntries is a descriptor without entries.
func noEntries() *rlcommon.RateLimitDescriptor { return &rlcommon.RateLimitDescriptor{} }

// marker is the last step of a stats scenario: one hit on key3 of
// basic_config.yaml (1 per hour), whose stat says the flush that carries
// it came after every earlier request's stats were counted.
const markerStat = "ratelimit.service.rate_limit.test-domain.key3.total_hits"

// TestDifferentialConfigTests: the descriptors of the reference's
// TestBasicConfig and TestConfigLimitOverride (test/config), on its
// basic_config.yaml: a descriptor without entries (OK, no limit, on a
// known and an unknown domain), the stat key of a limit override (the
// request's entries, "test-domain." with none), an unlimited rule (OK,
// limit_remaining 4294967295, no stats), detailed_metric keys. Answers and
// statsd stats must be the reference's; `validate` with the same
// environment and no path accepts the directory serve loaded.
func TestDifferentialConfigTests(t *testing.T) {
	refSink, ourSink := testproc.ListenStatsd(t), testproc.ListenStatsd(t)
	p := startPairWith(t, pairConfig{
		env:     []string{statsFlush},
		extra:   map[string]string{"basic_config.yaml": configTestFile(t, "basic_config.yaml")},
		refSink: refSink, ourSink: ourSink,
	})
	p.run(t, scenario{name: "config tests", limited: true, named: map[int]namedStep{20: dayHourOneKey}, steps: steps(
		one("unknown domain, no entries", req("foo_domain", noEntries())),
		one("no entries", req("test-domain", noEntries())),
		one("no entries next to a limit", req("test-domain", noEntries(), d("key2", "something"))),
		one("key1 something: no rule", req("test-domain", d("key1", "something"))),
		one("key1 value1: node without a limit", req("test-domain", d("key1", "value1"))),
		one("key2 value2 subkey: deeper than the config", req("test-domain", d("key2", "value2", "subkey", "subvalue"))),
		one("key5 value5 subkey5 subvalue: no rule", req("test-domain", d("key5", "value5", "subkey5", "subvalue"))),
		one("key1 value1 subkey1 something", req("test-domain", d("key1", "value1", "subkey1", "something"))),
		one("key1 value1 subkey1 subvalue1", req("test-domain", d("key1", "value1", "subkey1", "subvalue1"))),
		one("key2 something", req("test-domain", d("key2", "something"))),
		one("key2 value2", req("test-domain", d("key2", "value2"))),
		one("key2 value3: whitelisted", req("test-domain", d("key2", "value3"))),
		one("key4 foo", req("test-domain", d("key4", "foo"))),
		repeat(2, "key6 foo: unlimited", func() *rlsv3.RateLimitRequest { return req("test-domain", d("key6", "foo")) }),
		one("key6 next to a limit", req("test-domain", d("key6", "bar"), d("key2", "something"))),
		one("key7 detailed", req("test-domain", d("key7", "unspecified_value"))),
		one("key7 detailed, another value", req("test-domain", d("key7", "another_value"))),
		one("override, unknown domain, no entries", req("foo_domain", override(noEntries(), 10, "day"))),
		one("override 10/day", req("test-domain", override(d("key1", "value1", "subkey1", "something"), 10, "day"))),
		one("override 42/hour, same entries", req("test-domain", override(d("key1", "value1", "subkey1", "something"), 42, "hour"))),
		one("override 42/hour, other value", req("test-domain", override(d("key1", "value1", "subkey1", "something_else"), 42, "hour"))),
		one("override, no entries", req("test-domain", override(noEntries(), 42, "hour"))),
		one("override, empty key", req("test-domain", override(d("", "", "key2", "x"), 5, "minute"))),
		one("marker", req("test-domain", d("key3", "foo"))),
	)})
	compareStats(t, refSink, ourSink, markerStat)
	if code, out := p.validateAs(t); code != 0 {
		t.Errorf("validate with the reference's variables, no path: exit %d, want 0 (serve loaded it)\n%s", code, out)
	}
}

// TestDifferentialDomainMerge: the reference's TestDomainMerge, two files
// of one domain with MERGE_DOMAIN_CONFIG=true, and descriptors without
// entries.
func TestDifferentialDomainMerge(t *testing.T) {
	refSink, ourSink := testproc.ListenStatsd(t), testproc.ListenStatsd(t)
	p := startPairWith(t, pairConfig{
		env: []string{statsFlush, "MERGE_DOMAIN_CONFIG=true"},
		extra: map[string]string{
			"merge_domain_key1.yaml": configTestFile(t, "merge_domain_key1.yaml"),
			"merge_domain_key2.yaml": configTestFile(t, "merge_domain_key2.yaml"),
		},
		refSink: refSink, ourSink: ourSink,
	})
	p.run(t, scenario{name: "domain merge", limited: true, steps: steps(
		one("unknown domain, no entries", req("foo_domain", noEntries())),
		one("no entries", req("test-domain", noEntries())),
		one("key1 value1, first file", req("test-domain", d("key1", "value1"))),
		one("key2 value2, second file", req("test-domain", d("key2", "value2"))),
	)})
	compareStats(t, refSink, ourSink, "ratelimit.service.rate_limit.test-domain.key2_value2.total_hits")
	if code, out := p.validateAs(t); code != 0 {
		t.Errorf("validate with the reference's variables, no path: exit %d, want 0 (serve loaded it)\n%s", code, out)
	}
}

// TestDifferentialSameFileTwice: the reference's
// TestDuplicateKeyDomainMerge, one file loaded twice with
// MERGE_DOMAIN_CONFIG=true, as a Kubernetes ConfigMap volume shows it when
// dot files are not ignored (the file and its copy in the timestamped dot
// directory). Both servers refuse the config (a duplicate key), answer
// every call with the reference's error and count one config_load_error;
// `validate` refuses it too, with the same environment or the file twice.
func TestDifferentialSameFileTwice(t *testing.T) {
	refSink, ourSink := testproc.ListenStatsd(t), testproc.ListenStatsd(t)
	y := configTestFile(t, "merge_domain_key1.yaml")
	p := startPairWith(t, pairConfig{
		env: []string{statsFlush, "MERGE_DOMAIN_CONFIG=true", "RUNTIME_IGNOREDOTFILES"},
		extra: map[string]string{
			"merge_domain_key1.yaml":                                 y,
			"..2026_12_06_16_00_00.000000001/merge_domain_key1.yaml": y,
		},
		refSink: refSink, ourSink: ourSink, refusedConfig: true,
	})
	p.run(t, scenario{name: "same file twice", steps: steps(
		one("key1 value1", req("test-domain", d("key1", "value1"))),
		one("another domain of the directory", req("basic", d("key1", "x"))),
	)})
	compareStats(t, refSink, ourSink, "ratelimit.service.config_load_error")
	code, out := p.validateAs(t)
	if code != 1 || !strings.Contains(out, "duplicate descriptor composite key 'test-domain.key1_value1'") {
		t.Errorf("validate with the reference's variables, no path: exit %d, want 1 with the duplicate key\n%s", code, out)
	}
	f := filepath.Join(t.TempDir(), "merge_domain_key1.yaml")
	if err := os.WriteFile(f, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = p.validateAs(t, f, f)
	if code != 1 || !strings.Contains(out, "duplicate descriptor composite key 'test-domain.key1_value1'") {
		t.Errorf("validate FILE FILE with the reference's variables: exit %d, want 1 with the duplicate key\n%s", code, out)
	}
}

// dayHourOneKey is the documented difference of the 42/hour override
// that follows a 10/day override of the same entries: the reference's
// counter key is the entries and the window start, without the unit, so
// while an hour window and a day window start at the same instant (the
// first hour of a UTC day) the two overrides count on one key there. The
// keys of ratelimitd name the limit, so the hour's counter does not see
// the day's hit: one more remaining. In any other hour both agree.
var dayHourOneKey = namedStep{
	why: "the reference's hour and day counters of the same entries are one key during a UTC day's first hour",
	check: func(ref, ours answer) string {
		if msg := codes(ref, ours, 0, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK); msg != "" {
			return msg
		}
		r, o := ref.resp.GetStatuses()[0].GetLimitRemaining(), ours.resp.GetStatuses()[0].GetLimitRemaining()
		want := r
		if time.Now().UTC().Hour() == 0 {
			want = r + 1
		}
		if o != want {
			return fmt.Sprintf("limit_remaining %d, reference %d, want %d at %s", o, r, want, time.Now().UTC().Format(time.TimeOnly))
		}
		return ""
	},
}
