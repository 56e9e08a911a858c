package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlansExampleMatrix(t *testing.T) {
	set, warns, err := Load(LoadOptions{}, "../../examples/plans")
	if err != nil {
		t.Fatalf("examples/plans: %v", err)
	}
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	type want struct {
		rpu       uint32
		policy    string
		unlimited bool
		none      bool
	}
	planLimit := map[string]want{
		"free":       {rpu: 60, policy: "free"},
		"pro":        {rpu: 1000, policy: "pro"},
		"enterprise": {rpu: 10000, policy: "enterprise"},
		"internal":   {unlimited: true},
		"unknown":    {none: true},
	}
	routeLimit := map[string]map[string]want{
		"free":       {"search": {rpu: 60, policy: "free/search"}, "reports": {rpu: 10, policy: "free/reports"}, "ai": {rpu: 10, policy: "free/ai"}, "other": {none: true}},
		"pro":        {"search": {rpu: 60, policy: "pro/search"}, "reports": {rpu: 10, policy: "pro/reports"}, "ai": {rpu: 10, policy: "pro/ai"}, "other": {none: true}},
		"enterprise": {"search": {rpu: 60, policy: "enterprise/search"}, "reports": {rpu: 10, policy: "enterprise/reports"}, "ai": {rpu: 100, policy: "enterprise/ai"}, "other": {none: true}},
		"internal":   {"search": {unlimited: true}, "reports": {unlimited: true}, "ai": {unlimited: true}, "other": {none: true}},
	}
	check := func(t *testing.T, entries []Entry, w want) {
		t.Helper()
		m, ok := set.Match("api", entries)
		switch {
		case w.none:
			if ok {
				t.Errorf("%v matched %s, want no rule", entries, m.Rule.Path)
			}
			return
		case !ok:
			t.Errorf("%v: no rule, want %+v", entries, w)
			return
		case w.unlimited:
			if !m.Rule.Unlimited {
				t.Errorf("%v: rule %s not unlimited", entries, m.Rule.Path)
			}
			return
		}
		if len(m.Rule.Limits) != 1 {
			t.Fatalf("%v: %d limits", entries, len(m.Rule.Limits))
		}
		l := m.Rule.Limits[0]
		if l.RequestsPerUnit != w.rpu || l.Policy != w.policy || l.Unit != Minute {
			t.Errorf("%v: got %d/%v policy %q, want %d/minute policy %q", entries, l.RequestsPerUnit, l.Unit, l.Policy, w.rpu, w.policy)
		}
	}
	for plan, w := range planLimit {
		check(t, []Entry{{"plan", plan}, {"api_key", "k-123"}}, w)
	}
	for plan, routes := range routeLimit {
		for route, w := range routes {
			check(t, []Entry{{"plan", plan}, {"api_key", "k-123"}, {"route", route}}, w)
		}
	}
	// Exemption by credential, in every tier and on every route.
	for plan := range routeLimit {
		check(t, []Entry{{"plan", plan}, {"api_key", "k8s-readiness-probe"}}, want{unlimited: true})
		check(t, []Entry{{"plan", plan}, {"api_key", "k8s-readiness-probe"}, {"route", "ai"}}, want{unlimited: true})
	}
	// Anonymous per-IP layer.
	m, ok := set.Match("api", []Entry{{"remote_address", "198.51.100.7"}})
	if !ok || m.Rule.Limits[0].Policy != "anonymous" || m.Rule.Limits[0].Burst != 20 {
		t.Errorf("anonymous layer: ok=%v %+v", ok, m.Rule)
	}
	// The plan's own token bucket keeps its burst.
	m, _ = set.Match("api", []Entry{{"plan", "pro"}, {"api_key", "k"}})
	if m.Rule.Limits[0].Burst != 100 {
		t.Errorf("pro burst = %d, want 100", m.Rule.Limits[0].Burst)
	}
	// Counters are per credential: two keys of one plan never share one.
	a, _ := set.Match("api", []Entry{{"plan", "free"}, {"api_key", "a"}})
	b, _ := set.Match("api", []Entry{{"plan", "free"}, {"api_key", "b"}})
	if set.Key(a, 0) == set.Key(b, 0) {
		t.Error("two credentials share a counter")
	}
	// The expansion is visible in the explain dump.
	var sb strings.Builder
	if err := set.WriteExplain(&sb); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"free/search", "enterprise/ai", "anonymous"} {
		if !strings.Contains(sb.String(), s) {
			t.Errorf("explain output lacks %q:\n%s", s, sb.String())
		}
	}
}

func TestPlansErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string // substrings, each with its file:line
	}{
		{"missing keys", "domain: d\nplans:\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n",
			[]string{"x.yaml:3: plans: plan_key is required", "x.yaml:3: plans: credential_key is required"}},
		{"no tiers", "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n",
			[]string{"x.yaml:3: plans: tiers must be a non-empty mapping"}},
		{"unknown key", "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n  plan: x\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n",
			[]string{`x.yaml:5: unknown key "plan" in plans; did you mean "plan_key"?`}},
		{"bad tier limit", "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n  tiers:\n    free: {requests_per_unit: 1, unit: fortnight}\n",
			[]string{"x.yaml:6:", "fortnight"}},
		{"unknown tier override", "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n  route_key: r\n  routes:\n    ai:\n      rate_limit: {requests_per_unit: 1, unit: second}\n      tiers:\n        gold: {requests_per_unit: 2, unit: second}\n",
			[]string{`x.yaml:12: plans: route "ai" overrides unknown tier "gold"`}},
		{"routes without route_key", "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n  routes:\n    ai: {requests_per_unit: 1, unit: second}\n",
			[]string{"x.yaml:8: plans: routes need route_key"}},
		{"exempt without reason", "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n  exempt:\n    - credential: probe\n",
			[]string{`x.yaml:8: plans: exempt entry "probe" needs a reason`}},
		{"plans clash with descriptors", "domain: d\ndescriptors:\n  - key: p\n    value: free\nplans:\n  plan_key: p\n  credential_key: c\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n",
			[]string{"duplicate"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "x.yaml"), []byte(c.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := Load(LoadOptions{}, filepath.Join(dir, "x.yaml"))
			if err == nil {
				t.Fatal("load succeeded, want errors")
			}
			msg := strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), "")
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q:\n%s", w, msg)
				}
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("error is not a *ConfigError: %T", err)
			}
		})
	}
}
