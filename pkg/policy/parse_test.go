package policy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// loadOne writes yaml as x.yaml in a temp dir and loads it; errs are the
// joined errors as "x.yaml:line: message", in the order Load returns them.
func loadOne(t *testing.T, yaml string) (*Set, []Warning, []string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	set, warns, err := Load(LoadOptions{}, filepath.Join(dir, "x.yaml"))
	var got []string
	if err != nil {
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			var ce *ConfigError
			if !errors.As(e, &ce) {
				t.Fatalf("not a *ConfigError: %v", e)
			}
			got = append(got, strings.TrimPrefix(e.Error(), dir+string(filepath.Separator)))
		}
	}
	for i := range warns {
		warns[i].File = strings.TrimPrefix(warns[i].File, dir+string(filepath.Separator))
	}
	return set, warns, got
}

// TestMergeKeys: configs using YAML merge keys load and mean what
// yaml.v2 (envoyproxy/ratelimit) makes of them.
func TestMergeKeys(t *testing.T) {
	type want struct {
		entries []Entry
		rpu     uint32
		unit    Unit
		policy  string
		algo    string
	}
	cases := []struct {
		name, yaml string
		want       []want
	}{
		{"override explicit key", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &base {unit: minute, requests_per_unit: 10}\n  - key: b\n    rate_limit: {<<: *base, requests_per_unit: 20}\n",
			[]want{{[]Entry{{"a", ""}}, 10, Minute, "d.a", "fixed_window"}, {[]Entry{{"b", ""}}, 20, Minute, "d.b", "fixed_window"}}},
		{"explicit key before <<", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &base {unit: minute, requests_per_unit: 10}\n  - key: b\n    rate_limit: {requests_per_unit: 20, <<: *base}\n",
			[]want{{[]Entry{{"b", ""}}, 20, Minute, "d.b", "fixed_window"}}},
		{"merge list, earlier wins", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &one {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: &two {unit: hour, requests_per_unit: 2, algorithm: sliding_window}\n  - key: c\n    rate_limit:\n      <<: [*one, *two]\n",
			[]want{{[]Entry{{"c", ""}}, 1, Second, "d.c", "sliding_window"}}},
		{"nested merge", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &one {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: &two {<<: *one, requests_per_unit: 2}\n  - key: c\n    rate_limit: {<<: *two, name: cee}\n",
			[]want{{[]Entry{{"c", ""}}, 2, Second, "cee", "fixed_window"}}},
		{"descriptor merge", "domain: d\ndescriptors:\n  - &desc\n    key: a\n    value: x\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - <<: *desc\n    value: y\n",
			[]want{{[]Entry{{"a", "y"}}, 5, Day, "d.a_y", "fixed_window"}}},
		{"plans tiers and routes", "domain: d\nplans:\n  plan_key: plan\n  credential_key: key\n  tiers:\n    free: &free {unit: minute, requests_per_unit: 60}\n    pro: {<<: *free, requests_per_unit: 600}\n  route_key: route\n  routes:\n    ai: {<<: *free, requests_per_unit: 6}\n  anonymous:\n    key: remote_address\n    rate_limit: {<<: *free, requests_per_unit: 30}\n",
			[]want{
				{[]Entry{{"plan", "pro"}, {"key", "k"}}, 600, Minute, "pro", "fixed_window"},
				{[]Entry{{"plan", "pro"}, {"key", "k"}, {"route", "ai"}}, 6, Minute, "pro/ai", "fixed_window"},
				{[]Entry{{"remote_address", "1.2.3.4"}}, 30, Minute, "anonymous", "fixed_window"},
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			set, _, errs := loadOne(t, c.yaml)
			if errs != nil {
				t.Fatalf("load: %q", errs)
			}
			for _, w := range c.want {
				m, ok := set.Match("d", w.entries)
				if !ok || len(m.Rule.Limits) != 1 {
					t.Fatalf("%v: ok=%v rule %+v", w.entries, ok, m.Rule)
				}
				l := m.Rule.Limits[0]
				if l.RequestsPerUnit != w.rpu || l.Unit != w.unit || l.Policy != w.policy || AlgorithmName(l.Algorithm) != w.algo {
					t.Errorf("%v: got %d/%v policy %q %s, want %d/%v policy %q %s", w.entries, l.RequestsPerUnit, l.Unit, l.Policy, AlgorithmName(l.Algorithm), w.rpu, w.unit, w.policy, w.algo)
				}
			}
		})
	}
	// The metadata converter expands merge keys too.
	set, _, errs := loadOne(t, "domain: d\ndescriptors:\n  - key: a\n    metadata: &m {team: x, tier: 1}\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    metadata: {<<: *m, tier: 2}\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if errs != nil {
		t.Fatalf("metadata merge: %q", errs)
	}
	m, _ := set.Match("d", []Entry{{"b", ""}})
	if md := m.Rule.Metadata; md["team"] != "x" || md["tier"] != int64(2) || len(md) != 2 {
		t.Errorf("merged metadata = %#v", md)
	}
}

// TestParseErrorsExact asserts the complete, ordered error list (file:line:
// message) of configs a fresh user wrote.
func TestParseErrorsExact(t *testing.T) {
	const tier = "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n"
	cases := []struct {
		name, yaml string
		want       []string // every error, in order
	}{
		// merge keys
		{"merge of a scalar", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {<<: 5, unit: second, requests_per_unit: 1}\n",
			[]string{`x.yaml:4: merge key << must be a mapping, an alias of one or a list of them, got int "5"`}},
		{"merge list of a scalar", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      <<: [x]\n      unit: second\n      requests_per_unit: 1\n",
			[]string{`x.yaml:5: merge key << (line 5): list item must be a mapping or an alias of one, got str "x"`}},
		{"merge cycle", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &x {<<: *x, unit: second, requests_per_unit: 1}\n",
			[]string{"x.yaml:4: merge key << refers to a mapping that contains itself (or nests merges deeper than 32)"}},
		{"merged value keeps anchor line", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &b {unit: fortnight, requests_per_unit: 1}\n  - key: b\n    rate_limit:\n      <<: *b\n      requests_per_unit: 2\n",
			[]string{`x.yaml:4: invalid rate limit unit "fortnight": want second, minute, hour, day, week, month or year`, `x.yaml:4: invalid rate limit unit "fortnight": want second, minute, hour, day, week, month or year`}},
		{"explicit duplicates still reported", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &b {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit:\n      <<: *b\n      unit: minute\n      unit: hour\n",
			[]string{`x.yaml:9: duplicate key "unit" (first at line 8)`}},
		{"quoted << is a plain key", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {\"<<\": 1, unit: second, requests_per_unit: 1}\n",
			[]string{`x.yaml:4: unknown key "<<" in rate_limit`}},
		// plans
		{"anonymous without rate_limit", tier + "  anonymous: {key: remote_address}\n",
			[]string{"x.yaml:7: plans: anonymous needs a rate_limit (without one it limits nothing)"}},
		{"override of an unlimited tier", tier + "    internal: {unlimited: true}\n  route_key: r\n  routes:\n    ai:\n      rate_limit: {requests_per_unit: 1, unit: second}\n      tiers:\n        internal: {requests_per_unit: 2, unit: second}\n",
			[]string{`x.yaml:13: plans: route "ai" overrides tier "internal", which is unlimited (every route of an unlimited tier is unlimited); remove the override or give tier "internal" a limit`}},
		{"missing credential_key only", "domain: d\nplans:\n  plan_key: p\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n    pro: {requests_per_unit: 2, unit: second}\n",
			[]string{"x.yaml:3: plans: credential_key is required (the descriptor entry that keys the counters)"}},
		{"missing keys still check tiers", "domain: d\nplans:\n  tiers:\n    free: {requests_per_unit: 1, unit: fortnight}\n",
			[]string{"x.yaml:3: plans: plan_key is required (the descriptor entry that names the plan)", "x.yaml:3: plans: credential_key is required (the descriptor entry that keys the counters)",
				`x.yaml:4: invalid rate limit unit "fortnight": want second, minute, hour, day, week, month or year`}},
		// typo suggestions (edit distance), hints kept
		{"algoritm", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algoritm: token_bucket}\n",
			[]string{`x.yaml:4: unknown key "algoritm" in rate_limit; did you mean "algorithm"?`}},
		{"reqests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      reqests_per_unit: 1\n",
			[]string{`x.yaml:6: unknown key "reqests_per_unit" in rate_limit; did you mean "requests_per_unit"?`}},
		{"unit_multipler", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multipler: 2}\n",
			[]string{`x.yaml:4: unknown key "unit_multipler" in rate_limit; did you mean "unit_multiplier"?`}},
		{"bursts", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, bursts: 2}\n",
			[]string{`x.yaml:4: unknown key "bursts" in rate_limit; did you mean "burst"?`}},
		{"anonymus", tier + "  anonymus: {key: remote_address, rate_limit: {unit: second, requests_per_unit: 1}}\n",
			[]string{`x.yaml:7: unknown key "anonymus" in plans; did you mean "anonymous"?`}},
		{"descriptor typo", "domain: d\ndescriptors:\n  - key: a\n    shadow_mdoe: true\n",
			[]string{`x.yaml:4: unknown key "shadow_mdoe" in descriptor; did you mean "shadow_mode"?`}},
		{"top typo", "domain: d\ndescriptor: []\ndomian: e\n",
			[]string{`x.yaml:2: unknown key "descriptor" in top level; did you mean "descriptors"?`, `x.yaml:3: unknown key "domian" in top level; did you mean "domain"?`}},
		{"no suggestion when far", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, colour: red}\n",
			[]string{`x.yaml:4: unknown key "colour" in rate_limit`}},
		{"hint kept", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, rpu: 2}\n",
			[]string{`x.yaml:4: unknown key "rpu" in rate_limit; did you mean "requests_per_unit"?`}},
		// duplicate names, empty list
		{"duplicate limit name", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - name: n\n        unit: second\n        requests_per_unit: 1\n      - name: n\n        unit: minute\n        requests_per_unit: 5\n",
			[]string{`x.yaml:8: rate_limits: two limits named "n" on one descriptor (first at line 5): RateLimit-Policy could not tell them apart`}},
		{"empty rate_limits", "domain: d\ndescriptors:\n  - key: a\n    rate_limits: []\n",
			[]string{"x.yaml:4: rate_limits must be a non-empty list of rate_limit mappings, got an empty list"}},
		// ordering: the composite-key error (found at compile) sorts by line
		{"sorted by line", "domain: d\ndescriptors:\n  - key: a\n  - key: a\n  - key: b\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			[]string{"x.yaml:4: duplicate descriptor composite key 'd.a' (first at x.yaml:3)", `x.yaml:6: invalid rate limit unit "fortnight": want second, minute, hour, day, week, month or year`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, got := loadOne(t, c.yaml)
			// The composite-key message embeds the temp dir path.
			for i := range got {
				if j := strings.Index(got[i], "(first at "); j >= 0 {
					if k := strings.LastIndex(got[i], string(filepath.Separator)); k > j {
						got[i] = got[i][:j] + "(first at " + got[i][k+1:]
					}
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("errors:\n got  %q\n want %q", got, c.want)
			}
		})
	}
}

// TestPolicyNameCollisionWarning: two rules of one domain with the same
// RateLimit-Policy name load with a warning naming both lines.
func TestPolicyNameCollisionWarning(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"same explicit name", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: shared, unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {name: shared, unit: second, requests_per_unit: 2}\n",
			[]string{`x.yaml:6: warning: RateLimit-Policy name "shared" of descriptor "d.b" is also used by descriptor "d.a" (x.yaml:4)`}},
		{"name equal to a derived path", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {name: d.a, unit: second, requests_per_unit: 2}\n",
			[]string{`x.yaml:6: warning: RateLimit-Policy name "d.a" of descriptor "d.b" is also used by descriptor "d.a" (x.yaml:4)`}},
		{"distinct names", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: one, unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {name: two, unit: second, requests_per_unit: 2}\n", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, warns, errs := loadOne(t, c.yaml)
			if errs != nil {
				t.Fatalf("load: %q", errs)
			}
			var got []string
			for _, w := range warns {
				s := w.String()
				if i := strings.Index(s, "("); i >= 0 {
					if k := strings.LastIndex(s, string(filepath.Separator)); k > i {
						s = s[:i+1] + s[k+1:]
					}
				}
				got = append(got, s)
			}
			if len(got) != len(c.want) {
				t.Fatalf("warnings %q, want %q", got, c.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], c.want[i]) {
					t.Errorf("warning %q, want prefix %q", got[i], c.want[i])
				}
			}
		})
	}
}

func TestSuggest(t *testing.T) {
	cases := []struct{ k, want string }{
		{"algoritm", "algorithm"}, {"reqests_per_unit", "requests_per_unit"}, {"unit_multipler", "unit_multiplier"},
		{"bursts", "burst"}, {"nmae", "name"}, {"Unit", "unit"}, {"uint", "unit"}, {"xyz", ""}, {"calender", "calendar"},
		{"failuer_mode", "failure_mode"}, {"na", ""},
	}
	for _, c := range cases {
		if got := suggest(c.k, limitKeys); got != c.want {
			t.Errorf("suggest(%q) = %q, want %q", c.k, got, c.want)
		}
	}
	if d := osaDistance("ca", "ac"); d != 1 {
		t.Errorf("transposition distance = %d, want 1", d)
	}
}

// TestCounting: the descriptor field counting: is all_or_nothing or
// always_charge (absent: CountingDefault, the global policy), shows in
// the explain dump and the hash, and is rejected with its line when
// misspelt, of the wrong type, or on a descriptor without a limit.
func TestCounting(t *testing.T) {
	set, _, errs := loadOne(t, "domain: d\ndescriptors:\n  - key: a\n    counting: always_charge\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: b\n    counting: all_or_nothing\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, c := range []struct {
		key  string
		want Counting
	}{{"a", AlwaysCharge}, {"b", AllOrNothing}, {"c", CountingDefault}} {
		m, ok := set.Match("d", []Entry{{Key: c.key}})
		if !ok || m.Rule.Counting != c.want {
			t.Errorf("%s: counting %v, want %v", c.key, m.Rule.Counting, c.want)
		}
	}
	var b strings.Builder
	if err := set.WriteExplain(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "counting=always_charge") || strings.Count(b.String(), "counting=") != 2 {
		t.Errorf("explain does not show the counting policies:\n%s", b.String())
	}
	plain, _, _ := loadOne(t, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	charged, _, _ := loadOne(t, "domain: d\ndescriptors:\n  - key: a\n    counting: always_charge\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	if plain.Hash() == charged.Hash() {
		t.Error("the counting policy does not change the config hash")
	}
	for _, c := range []struct{ yaml, want string }{
		{"domain: d\ndescriptors:\n  - key: a\n    counting: always\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
			`x.yaml:4: invalid counting "always": want all_or_nothing or always_charge`},
		{"domain: d\ndescriptors:\n  - key: a\n    counting: [always_charge]\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
			"x.yaml:4: counting must be a string, got a list"},
		{"domain: d\ndescriptors:\n  - key: a\n    counting: always_charge\n    descriptors:\n      - key: b\n        rate_limit: {unit: minute, requests_per_unit: 10}\n",
			"x.yaml:4: counting applies to the limits of its descriptor, which has no rate_limit or rate_limits"},
	} {
		_, _, errs := loadOne(t, c.yaml)
		if len(errs) != 1 || errs[0] != c.want {
			t.Errorf("errors %q, want [%q]", errs, c.want)
		}
	}
	if _, err := ParseCounting("ALWAYS_CHARGE"); err == nil {
		t.Error("ParseCounting accepts a different case")
	}
}
