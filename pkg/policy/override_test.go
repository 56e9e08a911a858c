package policy

import (
	"strings"
	"testing"
)

// TestOverrideConfigErrors: bad override: mappings are rejected with
// file:line errors; good ones load.
func TestOverrideConfigErrors(t *testing.T) {
	rl := "    rate_limit: {unit: hour, requests_per_unit: 5}\n"
	cases := []struct {
		name, yaml string
		want       []string // "x.yaml:line: substring"; nil: loads
	}{
		{"domain all fields", "domain: d\noverride:\n  mode: lower_only\n  max: {requests_per_unit: 10, unit: second}\n  failure_mode: closed\ndescriptors:\n  - key: a\n" + rl, nil},
		{"rule mode and max", "domain: d\ndescriptors:\n  - key: a\n    override: {mode: allow, max: {requests_per_unit: 0, unit: day}}\n" + rl, nil},
		{"rule deny", "domain: d\ndescriptors:\n  - key: a\n    override: {mode: DENY}\n" + rl, nil},
		{"bad mode", "domain: d\noverride: {mode: raise}\n", []string{`x.yaml:2: invalid override mode "raise": want allow, deny or lower_only`}},
		{"not a mapping", "domain: d\noverride: deny\n", []string{`x.yaml:2: override must be a mapping with mode, max or failure_mode, got str "deny"`}},
		{"unknown key", "domain: d\noverride:\n  maxx: {requests_per_unit: 1, unit: second}\n", []string{`x.yaml:3: unknown key "maxx" in override; did you mean "max"?`}},
		{"max without unit", "domain: d\noverride:\n  max:\n    requests_per_unit: 3\n", []string{"x.yaml:3: override max needs requests_per_unit and unit"}},
		{"max bad unit", "domain: d\noverride:\n  max: {requests_per_unit: 3, unit: fortnight}\n", []string{`x.yaml:3: invalid override max unit "fortnight"`}},
		{"max negative", "domain: d\noverride:\n  max: {requests_per_unit: -1, unit: second}\n", []string{"x.yaml:3: override max requests_per_unit must not be negative"}},
		{"max with deny", "domain: d\noverride:\n  mode: deny\n  max: {requests_per_unit: 3, unit: second}\n", []string{"x.yaml:4: override max has no effect with mode deny"}},
		{"bad failure mode", "domain: d\noverride: {failure_mode: maybe}\n", []string{`x.yaml:2: invalid override failure_mode "maybe"`}},
		{"failure mode on rule", "domain: d\ndescriptors:\n  - key: a\n    override: {failure_mode: open}\n" + rl, []string{"x.yaml:4: override failure_mode is only allowed at the top level"}},
		{"rule without limit", "domain: d\ndescriptors:\n  - key: a\n    override: {mode: deny}\n    descriptors:\n      - key: b\n" + strings.ReplaceAll(rl, "    ", "        "), []string{"x.yaml:4: override applies to the rule of its descriptor, which has no rate_limit"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, errs := loadOne(t, c.yaml)
			if len(errs) != len(c.want) {
				t.Fatalf("errors %q, want %q", errs, c.want)
			}
			for i, w := range c.want {
				if !strings.HasPrefix(errs[i], w) {
					t.Errorf("error %q, want prefix %q", errs[i], w)
				}
			}
		})
	}
}

func TestOverrideMergedDomains(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml": head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\noverride: {mode: deny}\n",
		"b.yaml": head + "  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 2}\noverride: {mode: allow}\n",
	})
	_, _, err := Load(LoadOptions{MergeDomains: true}, dir)
	if err == nil || !strings.Contains(err.Error(), `b.yaml:5: override for domain "d" is set in two files (first at `) {
		t.Fatalf("err = %v", err)
	}
}

// TestOverridePolicy: what Set.Override builds under each policy.
func TestOverridePolicy(t *testing.T) {
	s, _, errs := loadOne(t, `domain: d
override: {failure_mode: closed, max: {requests_per_unit: 100, unit: minute}}
descriptors:
  - key: allow
    rate_limits:
      - {unit: hour, requests_per_unit: 5, failure_mode: local}
      - {unit: day, requests_per_unit: 50}
  - key: deny
    shadow_mode: true
    override: {mode: deny}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: lower
    value: "*"
    share_threshold: true
    override: {mode: lower_only}
    rate_limit: {unit: hour, requests_per_unit: 5, failure_mode: closed}
  - key: capped
    override: {max: {requests_per_unit: 3, unit: hour}}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
`)
	if errs != nil {
		t.Fatal(errs)
	}
	one := func(m Match) Spec {
		t.Helper()
		if m.Rule == nil || !m.Override || len(m.Rule.Limits) != 1 {
			t.Fatalf("match %+v", m)
		}
		return m.Rule.Limits[0]
	}
	// allow (default), under the domain's max 100/minute.
	if sp := one(s.Override("d", ents("allow", "x"), 4294967295, Second)); sp.RequestsPerUnit != 100 || sp.Unit != Minute || sp.FailureMode != FailLocal {
		t.Errorf("allow: %d/%s failure %s, want 100/minute (clamped) local (the rule's strictest)", sp.RequestsPerUnit, sp.Unit, sp.FailureMode)
	}
	if sp := one(s.Override("d", ents("allow", "x"), 90, Hour)); sp.RequestsPerUnit != 90 || sp.Unit != Hour {
		t.Errorf("allow under max: %d/%s, want 90/hour as sent", sp.RequestsPerUnit, sp.Unit)
	}
	// 1000/hour has a lower average rate than 100/minute but could admit
	// 1000 in one minute: clamped.
	if sp := one(s.Override("d", ents("allow", "x"), 1000, Hour)); sp.RequestsPerUnit != 100 || sp.Unit != Minute {
		t.Errorf("allow 1000/hour: %d/%s, want 100/minute", sp.RequestsPerUnit, sp.Unit)
	}
	// deny: the configured rule, shadow and all.
	dd, _, errs := loadOne(t, "domain: d\noverride: {mode: deny}\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	if errs != nil {
		t.Fatal(errs)
	}
	if m := dd.Override("d", ents("b", "x"), 1000, Second); m.Rule != nil {
		t.Errorf("domain deny, no rule: %+v, want no rule", m.Rule)
	}
	m := s.Override("d", ents("deny", "x"), 1000, Second)
	cfg, _ := s.Match("d", ents("deny", "x"))
	if m.Override || m.Rule != cfg.Rule || !m.Rule.ShadowMode || s.Key(m, 0) != s.Key(cfg, 0) {
		t.Errorf("deny: %+v, want the config match", m)
	}
	// lower_only: configured limit (same key as without override) + capped override.
	m = s.Override("d", ents("lower", "u1"), 4294967295, Second)
	cfg, _ = s.Match("d", ents("lower", "u1"))
	if !m.Override || len(m.Rule.Limits) != 2 {
		t.Fatalf("lower_only: %+v", m.Rule)
	}
	if s.Key(m, 0) != s.Key(cfg, 0) || s.Key(m, 1) == s.Key(cfg, 0) {
		t.Errorf("lower_only keys: configured %q vs %q, override %q", s.Key(m, 0), s.Key(cfg, 0), s.Key(m, 1))
	}
	if ov := m.Rule.Limits[1]; ov.RequestsPerUnit != 100 || ov.Unit != Minute || ov.FailureMode != FailClosed {
		t.Errorf("lower_only override %d/%s %s", ov.RequestsPerUnit, ov.Unit, ov.FailureMode)
	}
	// rule max beats the domain's; the cap checks requests per window too.
	if sp := one(s.Override("d", ents("capped", "x"), 4, Day)); sp.RequestsPerUnit != 3 || sp.Unit != Hour || sp.FailureMode != FailOpen {
		t.Errorf("capped: %d/%s %s, want 3/hour open", sp.RequestsPerUnit, sp.Unit, sp.FailureMode)
	}
	if sp := one(s.Override("d", ents("capped", "x"), 1, Minute)); sp.RequestsPerUnit != 3 {
		t.Errorf("capped 1/minute (60/hour): %d/%s, want 3/hour", sp.RequestsPerUnit, sp.Unit)
	}
	if sp := one(s.Override("d", ents("capped", "x"), 2, Hour)); sp.RequestsPerUnit != 2 || sp.Unit != Hour {
		t.Errorf("capped 2/hour: %d/%s, want as sent", sp.RequestsPerUnit, sp.Unit)
	}
	// no rule, or an unlimited one: the domain's failure_mode.
	for _, e := range [][]Entry{ents("nothing", "x"), ents("free", "x")} {
		if sp := one(s.Override("d", e, 1, Second)); sp.FailureMode != FailClosed || sp.RequestsPerUnit != 1 || sp.Unit != Second {
			t.Errorf("%v: %d/%s %s, want 1/second closed", e, sp.RequestsPerUnit, sp.Unit, sp.FailureMode)
		}
	}
	// Defaults: no override: mapping, the reference's behaviour.
	b := mustLoad(t, LoadOptions{}, "testdata/basic.yaml")
	if sp := one(b.Override("test-domain", ents("zzz", "x"), 4294967295, Second)); sp.RequestsPerUnit != 4294967295 || sp.FailureMode != FailOpen {
		t.Errorf("default: %+v", sp)
	}
}

func TestAboveMax(t *testing.T) {
	cases := []struct {
		rpu   uint32
		unit  Unit
		max   uint32
		mUnit Unit
		above bool
	}{
		{5, Hour, 5, Hour, false}, {6, Hour, 5, Hour, true},
		{1, Minute, 60, Hour, false}, {2, Minute, 60, Hour, true},
		{60, Day, 59, Hour, true}, // more per window than the cap
		{4294967295, Year, 4294967295, Second, false},
		{4294967295, Second, 4294967294, Year, true},
		{0, Second, 0, Year, false},
	}
	for _, c := range cases {
		if got := aboveMax(c.rpu, c.unit, c.max, c.mUnit); got != c.above {
			t.Errorf("aboveMax(%d/%s, %d/%s) = %v", c.rpu, c.unit, c.max, c.mUnit, got)
		}
	}
}

func TestOverrideExplain(t *testing.T) {
	s, _, errs := loadOne(t, "domain: d\noverride: {mode: lower_only}\ndescriptors:\n  - key: a\n    override: {max: {requests_per_unit: 3, unit: hour}}\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	if errs != nil {
		t.Fatal(errs)
	}
	var b strings.Builder
	if err := s.WriteExplain(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, w := range []string{`policy="d.a" override=lower_only override_max=3/hour (`, `policy="d.b" override=lower_only (`} {
		if !strings.Contains(got, w) {
			t.Errorf("explain lacks %q:\n%s", w, got)
		}
	}
	b.Reset()
	if err := mustLoad(t, LoadOptions{}, "testdata/basic.yaml").WriteExplain(&b); err != nil || strings.Contains(b.String(), "override") {
		t.Errorf("explain without override: config shows one (%v):\n%s", err, b.String())
	}
}
