package policy

import (
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Option combinations that cannot work as written are refused at the
// line of the option that does not apply: a leased durable limit (a lease
// lives in the fast store), a penalty on a durable limit (the durable
// store has no penalty box), a penalty on a leased limit (a leased hit
// never reaches the store that counts denials) and a penalty on an
// unlimited rule (nothing is ever denied, so no block ever starts).
func TestOptionCombinationsRefused(t *testing.T) {
	durable := DurableOptions{Enabled: true, Algorithms: []algo.Kind{algo.FixedWindow, algo.SlidingWindow}}
	for _, tc := range []struct{ yml, want string }{
		{head + "  - key: q\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n      store: durable\n      consistency: leased\n",
			`t.yaml:8: consistency: leased is not available with store: durable`},
		{head + "  - key: q\n    penalty: {after: 3, within: 1h, block: 5m}\n    rate_limit: {unit: day, requests_per_unit: 5, store: durable}\n",
			`t.yaml:4: descriptor "d.q": penalty is not available with store: durable`},
		{head + "  - key: q\n    penalty: {after: 3, within: 1h, block: 5m}\n    rate_limits:\n      - {unit: minute, requests_per_unit: 5}\n      - {unit: day, requests_per_unit: 50, store: durable}\n",
			`t.yaml:4: descriptor "d.q": penalty is not available with store: durable`},
		{head + "  - key: q\n    penalty: {after: 2, within: 1h, block: 5m}\n    rate_limit: {unit: minute, requests_per_unit: 2, consistency: leased}\n",
			`t.yaml:4: descriptor "d.q": penalty is not available with consistency: leased`},
		{head + "  - key: q\n    penalty: {after: 3, within: 1h, block: 5m}\n    rate_limits:\n      - {unit: second, requests_per_unit: 5}\n      - {unit: minute, requests_per_unit: 50, consistency: leased}\n",
			`t.yaml:4: descriptor "d.q": penalty is not available with consistency: leased`},
		{head + "  - key: q\n    penalty: {after: 3, within: 1h, block: 5m}\n    rate_limit: {unlimited: true}\n",
			`t.yaml:4: descriptor "d.q": penalty does nothing on an unlimited rule`},
	} {
		_, _, err := LoadSources(LoadOptions{Durable: durable}, Source{Name: "t.yaml", Data: []byte(tc.yml)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\nerror %v, want %q", tc.yml, err, tc.want)
		}
	}
	// Each option alone still loads.
	for _, yml := range []string{
		head + "  - key: q\n    rate_limit: {unit: day, requests_per_unit: 5, store: durable}\n",
		head + "  - key: q\n    penalty: {after: 3, within: 1h, block: 5m}\n    rate_limit: {unit: day, requests_per_unit: 5}\n",
		head + "  - key: q\n    rate_limit: {unit: minute, requests_per_unit: 5, consistency: leased}\n",
		head + "  - key: q\n    rate_limit: {unlimited: true}\n",
	} {
		if _, _, err := LoadSources(LoadOptions{Durable: durable}, Source{Name: "t.yaml", Data: []byte(yml)}); err != nil {
			t.Errorf("%s\nrefused: %v", yml, err)
		}
	}
}

// A leased limit with a window of an hour or longer loads with a warning
// at its consistency line: a Redis restart denies the rest of the window.
func TestLeasedLongWindowWarns(t *testing.T) {
	yml := head +
		"  - key: h\n    rate_limit: {unit: hour, requests_per_unit: 1000, consistency: leased}\n" +
		"  - key: m\n    rate_limit: {unit: minute, requests_per_unit: 1000, consistency: leased}\n" +
		"  - key: m60\n    rate_limit: {unit: minute, unit_multiplier: 60, requests_per_unit: 1000, consistency: leased}\n" +
		"  - key: e\n    rate_limit: {unit: day, requests_per_unit: 1000}\n"
	_, warns, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(yml)})
	if err != nil {
		t.Fatal(err)
	}
	var lines []int
	for _, w := range warns {
		if strings.Contains(w.Message, "consistency: leased on a window of") {
			if !strings.Contains(w.Message, "a restart of Redis denies every leased hit until the window ends") {
				t.Errorf("warning %q does not say what a restart costs", w.Message)
			}
			lines = append(lines, w.Line)
		}
	}
	if len(lines) != 2 || lines[0] != 4 || lines[1] != 8 {
		t.Errorf("leased long-window warnings at lines %v, want [4 8] (warnings %v)", lines, warns)
	}
}

// A leased limit refused (store: durable, or an algorithm or calendar
// window leases do not serve) gets its error alone: the long-window
// warning is about a leased limit that loads, so it would only distract.
func TestLeasedRefusedWithoutWarning(t *testing.T) {
	durable := DurableOptions{Enabled: true, Algorithms: []algo.Kind{algo.FixedWindow, algo.SlidingWindow}}
	for _, tc := range []struct{ yml, want string }{
		{head + "  - key: q\n    rate_limit: {unit: hour, requests_per_unit: 100, store: durable, consistency: leased}\n",
			"t.yaml:4: consistency: leased is not available with store: durable"},
		{head + "  - key: q\n    rate_limit: {unit: day, requests_per_unit: 100, algorithm: sliding_log, consistency: leased}\n",
			"t.yaml:4: consistency: leased applies to fixed_window, sliding_window and token_bucket"},
		{head + "  - key: q\n    rate_limit: {unit: month, requests_per_unit: 100, calendar: true, consistency: leased}\n",
			"t.yaml:4: consistency: leased applies to fixed_window, sliding_window and token_bucket"},
	} {
		_, warns, err := LoadSources(LoadOptions{Durable: durable}, Source{Name: "t.yaml", Data: []byte(tc.yml)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\nerror %v, want %q", tc.yml, err, tc.want)
		}
		if len(warns) != 0 {
			t.Errorf("%s\nwarnings %v beside the error, want none", tc.yml, warns)
		}
	}
}

// validate --explain shows a rule's penalty, as it shows reserve.
func TestExplainPenalty(t *testing.T) {
	s, _, errs := loadOne(t, head+"  - key: p\n    penalty: {after: 3, within: 1h, block: 5m, extend: true}\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: n\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	if errs != nil {
		t.Fatal(errs)
	}
	var b strings.Builder
	if err := s.WriteExplain(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	if !strings.Contains(got, `policy="d.p" penalty=3/1h0m0s:block=5m0s,extend`) {
		t.Errorf("explain lacks d.p's penalty:\n%s", got)
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.Contains(line, `"d.n"`) && strings.Contains(line, "penalty") {
			t.Errorf("explain shows a penalty on d.n: %s", line)
		}
	}
}
