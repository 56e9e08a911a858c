package policy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

func ents(kv ...string) []Entry {
	out := make([]Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func mustLoad(t testing.TB, opts LoadOptions, paths ...string) *Set {
	t.Helper()
	s, _, err := Load(opts, paths...)
	if err != nil {
		t.Fatalf("Load(%v): %v", paths, err)
	}
	return s
}

type matchCase struct {
	name    string
	domain  string
	entries []Entry
	// want: "" = no match; "unlimited"; else "<rpu>/<unit>" of Limits[0]
	want   string
	metric string // expected MetricKey when non-empty
}

func describe(m Match, ok bool) string {
	if !ok {
		return ""
	}
	if m.Rule.Unlimited {
		return "unlimited"
	}
	l := m.Rule.Limits[0]
	return strings.ToLower(l.Unit.String())[:3] + ":" + itoa(int(l.RequestsPerUnit))
}

func itoa(i int) string { return string(appendNSIntRaw(nil, i)) }

func appendNSIntRaw(b []byte, i int) []byte {
	if i >= 10 {
		b = appendNSIntRaw(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

func runMatch(t *testing.T, s *Set, cases []matchCase) {
	t.Helper()
	for _, c := range cases {
		m, ok := s.Match(c.domain, c.entries)
		if got := describe(m, ok); got != c.want {
			t.Errorf("%s: Match(%q, %v) = %q, want %q", c.name, c.domain, c.entries, got, c.want)
			continue
		}
		if ok && c.metric != "" && m.MetricKey != c.metric {
			t.Errorf("%s: MetricKey = %q, want %q", c.name, m.MetricKey, c.metric)
		}
	}
}

func TestMatchBasic(t *testing.T) {
	s := mustLoad(t, LoadOptions{}, "testdata/basic.yaml")
	const d = "test-domain"
	runMatch(t, s, []matchCase{
		{"default under key1_value1", d, ents("key1", "value1", "subkey1", "something"), "sec:5", "test-domain.key1_value1.subkey1"},
		{"exact beats default", d, ents("key1", "value1", "subkey1", "subvalue1"), "sec:10", "test-domain.key1_value1.subkey1_subvalue1"},
		{"intermediate without limit", d, ents("key1", "value1"), "", ""},
		{"no key1 default at top", d, ents("key1", "something"), "", ""},
		{"key2 default", d, ents("key2", "something"), "min:20", "test-domain.key2"},
		{"key2 exact", d, ents("key2", "value2"), "min:30", "test-domain.key2_value2"},
		{"whitelist shadows default", d, ents("key2", "value3"), "", ""},
		{"empty value uses default", d, ents("key2", ""), "min:20", ""},
		{"deeper than config", d, ents("key2", "value2", "subkey", "subvalue"), "", ""},
		{"intermediate with limit, request stops", d, ents("key5", "value5"), "day:15", "test-domain.key5_value5"},
		{"child of limited intermediate", d, ents("key5", "value5", "subkey5", "subvalue5"), "day:25", ""},
		{"child mismatch", d, ents("key5", "value5", "subkey5", "other"), "", ""},
		{"unlimited", d, ents("key6", "x"), "unlimited", ""},
		{"detailed metric", d, ents("key7", "unspecified_value"), "min:70", "test-domain.key7_unspecified_value"},
		{"unknown domain", "nope", ents("key2", "x"), "", ""},
		{"no entries", d, nil, "", ""},
		{"unknown key", d, ents("zzz", "x"), "", ""},
		{"key3 hour", d, ents("key3", "1.2.3.4"), "hou:1", ""},
		{"key4 day", d, ents("key4", "x"), "day:1", ""},
	})
	if !s.HasDomain(d) || s.HasDomain("nope") {
		t.Errorf("HasDomain wrong")
	}
}

func TestMatchWildcard(t *testing.T) {
	s := mustLoad(t, LoadOptions{}, "testdata/wildcard.yaml")
	const d = "wildcard"
	runMatch(t, s, []matchCase{
		{"trailing", d, ents("wild", "foo1"), "min:20", "wildcard.wild_foo*"},
		{"trailing empty rest", d, ents("wild", "foo"), "min:20", ""},
		{"trailing no", d, ents("wild", "fo"), "", ""},
		{"middle barab", d, ents("midWild", "barab"), "min:21", ""},
		{"middle barb", d, ents("midWild", "barb"), "min:21", ""},
		{"middle bara", d, ents("midWild", "bara"), "", ""},
		{"middle xbarb", d, ents("midWild", "xbarb"), "", ""},
		{"multi", d, ents("multiWild", "foobarbaz"), "min:22", ""},
		{"multi filled", d, ents("multiWild", "foo1bar2baz"), "min:22", ""},
		{"multi missing bar", d, ents("multiWild", "foo123baz"), "", ""},
		{"multi overlap", d, ents("multiWild", "foobaz"), "", ""},
		{"noWild exact only", d, ents("noWild", "foo1"), "", ""},
		{"noWild exact", d, ents("noWild", "foo"), "min:23", ""},
		{"nested", d, ents("nestedWild", "val1", "wild", "goo2"), "min:24", "wildcard.nestedWild_val1.wild_goo*"},
		{"nested no", d, ents("nestedWild", "val1", "wild", "foo2"), "", ""},
		{"first declared wildcard wins", d, ents("order", "abx"), "sec:1", ""},
		{"exact beats wildcard", d, ents("order", "abc"), "sec:3", ""},
		{"default after wildcards", d, ents("order", "zzz"), "sec:4", ""},
		{"share threshold", d, ents("shared", "files/a.txt"), "hou:100", "wildcard.shared_files/*"},
		{"value_to_metric", d, ents("route", "api", "http_method", "GET", "subject_id", "123"), "min:60", "wildcard.route_api.http_method_GET.subject_id"},
		// Deliberate fix: the reference matched "a_b*" against "key_value",
		// so key "a_b" with value "x" matched config key "a" value "b*".
		{"no key_value concatenation", d, ents("a_b", "x"), "", ""},
		{"a b*", d, ents("a", "bcd"), "sec:7", ""},
		{"star matches empty", d, ents("star", ""), "sec:8", ""},
		{"star matches anything", d, ents("star", "x\ny"), "sec:8", ""},
	})
}

func TestShareThresholdKey(t *testing.T) {
	s := mustLoad(t, LoadOptions{}, "testdata/wildcard.yaml")
	m1, ok1 := s.Match("wildcard", ents("shared", "files/a"))
	m2, ok2 := s.Match("wildcard", ents("shared", "files/b"))
	if !ok1 || !ok2 {
		t.Fatal("no match")
	}
	if s.Key(m1, 0) != s.Key(m2, 0) {
		t.Errorf("share_threshold: keys differ")
	}
	w1, _ := s.Match("wildcard", ents("wild", "foo1"))
	w2, _ := s.Match("wildcard", ents("wild", "foo2"))
	if s.Key(w1, 0) == s.Key(w2, 0) {
		t.Errorf("wildcard without share_threshold: keys equal")
	}
}

func TestReadmeExamples(t *testing.T) {
	s := mustLoad(t, LoadOptions{}, "testdata/readme.yaml")
	const d = "readme"
	runMatch(t, s, []matchCase{
		{"nested default", d, ents("remote_address", "10.0.0.1"), "sec:10", "readme.remote_address"},
		{"specific address", d, ents("remote_address", "50.0.0.5"), "sec:1", "readme.remote_address_50.0.0.5"},
		{"example 4 depth", d, ents("key", "value", "subkey", "subvalue"), "", ""},
		{"example 4 exact", d, ents("key", "value"), "sec:1", ""},
		{"replaced limit", d, ents("key_1", "value_1", "user", "bkthomps"), "sec:5", ""},
		{"replacing limit", d, ents("key_2", "value_2", "user", "bkthomps"), "sec:10", ""},
		{"unlimited", d, ents("internal", "health"), "unlimited", ""},
	})
	m, _ := s.Match(d, ents("key_1", "value_1", "user", "x"))
	if m.Rule.Name != "specific_limit" || m.Rule.Limits[0].Name != "specific_limit" || m.Rule.Limits[0].Policy != "specific_limit" {
		t.Errorf("name: rule %q spec %+v", m.Rule.Name, m.Rule.Limits[0])
	}
	m, _ = s.Match(d, ents("key_2", "value_2", "user", "x"))
	if len(m.Rule.Replaces) != 1 || m.Rule.Replaces[0] != "specific_limit" {
		t.Errorf("replaces = %v", m.Rule.Replaces)
	}
	m, _ = s.Match(d, ents("shadow", "x"))
	if !m.Rule.ShadowMode || m.Rule.QuotaMode {
		t.Errorf("shadow flags: %+v", m.Rule)
	}
	m, _ = s.Match(d, ents("quota", "x"))
	if !m.Rule.QuotaMode || m.Rule.ShadowMode {
		t.Errorf("quota flags: %+v", m.Rule)
	}
	if m.Rule.Metadata["tier"] != "gold" {
		t.Errorf("metadata = %#v", m.Rule.Metadata)
	}
	w, ok := m.Rule.Metadata["weights"].([]any)
	if !ok || len(w) != 4 || w[0] != int64(1) || w[1] != 2.5 || w[2] != true || w[3] != nil {
		t.Errorf("metadata weights = %#v", m.Rule.Metadata["weights"])
	}
	m, _ = s.Match(d, ents("internal", "health"))
	if m.Rule.Name != "free" || len(m.Rule.Limits) != 0 {
		t.Errorf("unlimited rule: %+v", m.Rule)
	}
}

func TestExtensions(t *testing.T) {
	s, warns, err := Load(LoadOptions{}, "testdata/extensions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, ok := s.Match("ext", ents("api_key", "k"))
	if !ok || len(m.Rule.Limits) != 3 {
		t.Fatalf("api_key: ok=%v %+v", ok, m.Rule)
	}
	l := m.Rule.Limits
	want0 := algo.Limit{Kind: algo.TokenBucket, Rate: 20, Period: 1e9, Burst: 40, Multiplier: 1}
	if l[0].Limit != want0 || l[0].FailureMode != FailLocal || l[0].Burst != 40 || l[0].Policy != "ext.api_key" {
		t.Errorf("limit 0 = %+v", l[0])
	}
	if l[1].Algorithm != algo.SlidingWindow || l[1].Unit != Day || l[1].Policy != "ext.api_key#2" || l[1].Window != 24*3600e9 {
		t.Errorf("limit 1 = %+v", l[1])
	}
	if !l[2].Calendar || l[2].Limit.Calendar != algo.CalendarMonth || l[2].Policy != "monthly" || l[2].Window != 30*24*3600e9 {
		t.Errorf("limit 2 = %+v", l[2])
	}
	m, _ = s.Match("ext", ents("upload", "u"))
	if sp := m.Rule.Limits[0]; sp.Algorithm != algo.Concurrency || sp.UnitMultiplier != 5 || sp.Limit.Period != 300e9 || sp.FailureMode != FailClosed {
		t.Errorf("upload = %+v", sp)
	}
	m, _ = s.Match("ext", ents("path", "/v1/café"))
	if sp := m.Rule.Limits[0]; sp.Policy != "ext.path_/v1/caf%C3%A9" || sp.Window != 10e9 {
		t.Errorf("path policy = %q window %v", sp.Policy, sp.Window)
	}
	// login uses sliding_log: no fixed-window warning.
	if len(warns) != 0 {
		t.Errorf("warnings = %v", warns)
	}
}

func TestRelease(t *testing.T) {
	s := mustLoad(t, LoadOptions{}, "testdata/extensions.yaml")
	m, ok := s.Match("ext", ents("upload", "u", ReleaseKey, ""))
	if !ok || !m.Release {
		t.Fatalf("release: ok=%v release=%v", ok, m.Release)
	}
	acq, _ := s.Match("ext", ents("upload", "u"))
	if acq.Release || s.Key(acq, 0) != s.Key(m, 0) {
		t.Errorf("acquire and release keys differ")
	}
	// A release on a node without a concurrency limit matches nothing.
	if _, ok := s.Match("ext", ents("login", "x", ReleaseKey, "1")); ok {
		t.Errorf("release on non-concurrency rule matched")
	}
	if _, ok := s.Match("ext", ents(ReleaseKey, "")); ok {
		t.Errorf("bare release matched")
	}
}

func TestOverride(t *testing.T) {
	s := mustLoad(t, LoadOptions{}, "testdata/basic.yaml")
	m := s.Override("test-domain", ents("key2", "value2", "x", ""), 7, Hour)
	if m.Rule == nil || len(m.Rule.Limits) != 1 {
		t.Fatal("no rule")
	}
	sp := m.Rule.Limits[0]
	if sp.RequestsPerUnit != 7 || sp.Unit != Hour || sp.Algorithm != algo.FixedWindow || sp.Limit.Rate != 7 || sp.Limit.Period != 3600e9 {
		t.Errorf("override spec %+v", sp)
	}
	if m.MetricKey != "test-domain.key2_value2.x" {
		t.Errorf("override metric key %q", m.MetricKey)
	}
	// envoyproxy/ratelimit's stat key of an override: '.' after the
	// domain always, between entries only once something was written.
	for _, c := range []struct {
		entries []Entry
		want    string
	}{
		{nil, "test-domain."},
		{ents("", ""), "test-domain."},
		{ents("", "", "key2", "x"), "test-domain.key2_x"},
		{ents("key2", "x", "", ""), "test-domain.key2_x."},
		{ents("", "v", "k", ""), "test-domain._v.k"},
	} {
		if got := s.Override("test-domain", c.entries, 5, Minute).MetricKey; got != c.want {
			t.Errorf("override metric key of %v = %q, want %q", c.entries, got, c.want)
		}
	}
	if strings.Contains(sp.Policy, "value2") {
		t.Errorf("override policy carries a request value: %q", sp.Policy)
	}
	cfg, _ := s.Match("test-domain", ents("key2", "value2"))
	o := s.Override("test-domain", ents("key2", "value2"), 30, Minute)
	if s.Key(cfg, 0) == s.Key(o, 0) {
		t.Errorf("override key collides with config key")
	}
	if o2 := s.Override("test-domain", ents("key2", "value2"), 30, Hour); s.Key(o2, 0) == s.Key(o, 0) {
		t.Errorf("override keys of different units collide")
	}
	if bad := s.Override("test-domain", ents("a", "b"), 1, UnitUnknown); bad.Rule != nil {
		t.Errorf("invalid unit gave a rule")
	}
}

func TestExplainAndHash(t *testing.T) {
	s := mustLoad(t, LoadOptions{}, "testdata/basic.yaml", "testdata/extensions.yaml")
	var b bytes.Buffer
	if err := s.WriteExplain(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"test-domain.key1_value1.subkey1: fixed_window 5/second failure_mode=open policy=\"test-domain.key1_value1.subkey1\" (testdata/basic.yaml:9)\n",
		"test-domain.key6: unlimited (testdata/basic.yaml:",
		"ext.api_key: token_bucket 20/second burst=40 failure_mode=local policy=\"ext.api_key\"; sliding_window 10000/day failure_mode=open policy=\"ext.api_key#2\"; fixed_window 100000/month calendar failure_mode=open policy=\"monthly\" name=\"monthly\" (testdata/extensions.yaml:3)",
		"ext.upload: concurrency 3/minute×5 failure_mode=closed",
		"test-domain.key7: fixed_window 70/minute failure_mode=open policy=\"test-domain.key7\" detailed_metric",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != len(s.Rules()) {
		t.Errorf("explain has %d lines for %d rules", n, len(s.Rules()))
	}
	if got := s.Domains(); len(got) != 2 || got[0] != "ext" || got[1] != "test-domain" {
		t.Errorf("Domains = %v", got)
	}
	s2 := mustLoad(t, LoadOptions{}, "testdata/extensions.yaml", "testdata/basic.yaml")
	if s.Hash() == "" || s.Hash() != s2.Hash() {
		t.Errorf("hash differs across file order: %s %s", s.Hash(), s2.Hash())
	}
	s3 := mustLoad(t, LoadOptions{}, "testdata/basic.yaml")
	if s3.Hash() == s.Hash() {
		t.Errorf("hash equal for different configs")
	}
}

func TestNilSet(t *testing.T) {
	var s *Set
	if _, ok := s.Match("d", ents("a", "b")); ok || s.HasDomain("d") || s.Rules() != nil || s.Domains() != nil || s.Hash() != "" {
		t.Errorf("nil set answered")
	}
}
