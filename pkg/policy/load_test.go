package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFiles creates files (name -> content) under a new temp dir.
func writeFiles(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const head = "domain: d\ndescriptors:\n"

func TestLoadErrors(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		merge bool
		// want: "file:line: substring", one per expected error, in any order
		want []string
	}{
		{"yaml syntax", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    value: [b\n"}, false,
			[]string{"a.yaml:4: YAML syntax error: did not find expected"}},
		{"yaml bad indent", map[string]string{"a.yaml": "domain: d\n  x: y\n"}, false,
			[]string{"a.yaml:2: YAML syntax error: mapping values are not allowed"}},
		{"unknown top key", map[string]string{"a.yaml": "domain: d\nfoo: 1\n"}, false,
			[]string{`a.yaml:2: unknown key "foo" in top level`}},
		{"ratelimit misspelled", map[string]string{"a.yaml": head + "  - key: a\n    ratelimit:\n      unit: second\n"}, false,
			[]string{`a.yaml:4: unknown key "ratelimit" in descriptor; did you mean "rate_limit"?`}},
		{"requestsperunit", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      requestsperunit: 5\n"}, false,
			[]string{`a.yaml:6: unknown key "requestsperunit" in rate_limit; did you mean "requests_per_unit"?`}},
		{"unit at descriptor level", map[string]string{"a.yaml": head + "  - key: a\n    unit: second\n"}, false,
			[]string{`a.yaml:4: unknown key "unit" in descriptor (belongs in rate_limit)`}},
		{"shadow_mode inside rate_limit", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      shadow_mode: true\n"}, false,
			[]string{`a.yaml:6: unknown key "shadow_mode" in rate_limit (belongs in the descriptor`}},
		{"empty domain", map[string]string{"a.yaml": "domain: \"\"\ndescriptors: []\n"}, false,
			[]string{"a.yaml:1: config file cannot have empty domain"}},
		{"missing domain", map[string]string{"a.yaml": "descriptors: []\n"}, false,
			[]string{"a.yaml:1: config file cannot have empty domain"}},
		{"empty file", map[string]string{"a.yaml": "# nothing\n"}, false,
			[]string{"a.yaml:1: empty config file"}},
		{"not a mapping", map[string]string{"a.yaml": "- a\n- b\n"}, false,
			[]string{"a.yaml:1: config file must be a mapping"}},
		{"two documents", map[string]string{"a.yaml": "domain: d\n---\ndomain: e\n"}, false,
			[]string{"a.yaml:2: a config file holds one YAML document"}},
		{"duplicate domain", map[string]string{"a.yaml": "domain: d\n", "b.yaml": "\ndomain: d\n"}, false,
			[]string{`b.yaml:2: duplicate domain "d" in config file (first defined at `}},
		{"merge duplicate sibling across files", map[string]string{
			"a.yaml": head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"b.yaml": head + "  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n"}, true,
			[]string{"b.yaml:5: duplicate descriptor composite key 'd.k' (first at "}},
		{"empty key", map[string]string{"a.yaml": head + "  - key: \"\"\n"}, false,
			[]string{"a.yaml:3: descriptor has empty key"}},
		{"missing key", map[string]string{"a.yaml": head + "  - value: v\n"}, false,
			[]string{"a.yaml:3: descriptor has empty key"}},
		{"duplicate key/value", map[string]string{"a.yaml": head + "  - key: a\n    value: b\n  - key: a\n    value: b\n"}, false,
			[]string{"a.yaml:5: duplicate descriptor composite key 'd.a_b' (first at "}},
		{"duplicate value-less", map[string]string{"a.yaml": head + "  - key: a\n    descriptors:\n      - key: x\n      - key: x\n"}, false,
			[]string{"a.yaml:6: duplicate descriptor composite key 'd.a.x'"}},
		{"duplicate wildcard", map[string]string{"a.yaml": head + "  - key: a\n    value: b*\n  - key: a\n    value: b*\n"}, false,
			[]string{"a.yaml:5: duplicate descriptor composite key 'd.a_b*'"}},
		{"invalid unit", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"}, false,
			[]string{`a.yaml:5: invalid rate limit unit "fortnight"`}},
		{"missing unit", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      requests_per_unit: 1\n"}, false,
			[]string{"a.yaml:4: invalid rate limit unit '': unit is required"}},
		{"unit with unlimited", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n"}, false,
			[]string{"a.yaml:6: should not specify rate limit unit when unlimited"}},
		{"unlimited with extension", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unlimited: true\n      algorithm: token_bucket\n"}, false,
			[]string{"a.yaml:5: unlimited rate_limit must not set algorithm"}},
		{"replaces empty name", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      replaces:\n        - name: \"\"\n"}, false,
			[]string{"a.yaml:7: replaces: name must not be empty"}},
		{"replaces itself", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      name: me\n      unit: second\n      replaces:\n        - name: me\n"}, false,
			[]string{`a.yaml:8: replaces: rate limit "me" cannot replace itself`}},
		{"replaces sibling limit", map[string]string{"a.yaml": head + "  - key: a\n    rate_limits:\n      - name: one\n        unit: second\n      - unit: day\n        replaces:\n          - name: one\n"}, false,
			[]string{`a.yaml:9: replaces: rate limit "one" cannot replace a limit of its own descriptor`}},
		{"replaces unknown field", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      replaces:\n        - nam: x\n"}, false,
			[]string{`a.yaml:7: unknown key "nam" in replaces item`, "a.yaml:7: replaces: name must not be empty"}},
		{"share_threshold without wildcard", map[string]string{"a.yaml": head + "  - key: a\n    value: b\n    share_threshold: true\n"}, false,
			[]string{`a.yaml:5: share_threshold requires a value with a '*' wildcard`}},
		{"non-map list items", map[string]string{"a.yaml": head + "  - a\n  - b\n"}, false,
			[]string{"a.yaml:3: descriptors: list of type other than map", "a.yaml:4: descriptors: list of type other than map"}},
		{"descriptors not a list", map[string]string{"a.yaml": head + "  key: a\n"}, false,
			[]string{"a.yaml:3: descriptors must be a list"}},
		{"non-string key", map[string]string{"a.yaml": head + "  - key: a\n    0.25: x\n"}, false,
			[]string{"a.yaml:4: key is not of type string"}},
		{"duplicate yaml key", map[string]string{"a.yaml": head + "  - key: a\n    key: b\n"}, false,
			[]string{`a.yaml:4: duplicate key "key" (first at line 3)`}},
		{"float requests_per_unit", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1.5\n"}, false,
			[]string{"a.yaml:6: requests_per_unit must be an integer, got float \"1.5\""}},
		{"negative requests_per_unit", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n"}, false,
			[]string{"a.yaml:6: requests_per_unit must not be negative"}},
		{"requests_per_unit above uint32", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n"}, false,
			[]string{"a.yaml:6: requests_per_unit: 4294967296 is out of range (maximum 4294967295)"}},
		{"requests_per_unit above int64", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 99999999999999999999\n"}, false,
			[]string{"a.yaml:6: requests_per_unit: 99999999999999999999 is out of range (maximum 4294967295)"}},
		{"requests_per_unit below int64", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -99999999999999999999\n"}, false,
			[]string{"a.yaml:6: requests_per_unit must not be negative"}},
		{"penalty after above int64", map[string]string{"a.yaml": head + "  - key: a\n    penalty: {after: 99999999999999999999, within: 1h, block: 5m}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, false,
			[]string{"a.yaml:4: penalty after: 99999999999999999999 is out of range (maximum 1000000)"}},
		{"string requests_per_unit", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: ten\n"}, false,
			[]string{`a.yaml:6: requests_per_unit must be an integer, got str "ten"`}},
		{"bool not bool", map[string]string{"a.yaml": head + "  - key: a\n    shadow_mode: maybe\n"}, false,
			[]string{`a.yaml:4: shadow_mode must be true or false`}},
		{"sliding_log bound", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      algorithm: sliding_log\n      unit: minute\n      requests_per_unit: 10001\n"}, false,
			[]string{"a.yaml:7: sliding_log keeps one entry per admitted request: requests_per_unit 10001 is above its bound 10000; use algorithm sliding_window"}},
		{"burst on fixed window", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      burst: 5\n"}, false,
			[]string{"a.yaml:6: burst applies to algorithm token_bucket only"}},
		{"burst zero", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      algorithm: token_bucket\n      unit: second\n      burst: 0\n"}, false,
			[]string{"a.yaml:7: burst must be at least 1, got 0"}},
		{"unit_multiplier zero", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      unit_multiplier: 0\n"}, false,
			[]string{"a.yaml:6: unit_multiplier must be at least 1, got 0"}},
		{"bad algorithm", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      algorithm: leaky\n"}, false,
			[]string{`a.yaml:6: invalid algorithm "leaky"`}},
		{"bad failure_mode", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      failure_mode: maybe\n"}, false,
			[]string{`a.yaml:6: invalid failure_mode "maybe"`}},
		{"leased sliding_log", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      algorithm: sliding_log\n      consistency: leased\n"}, false,
			[]string{"a.yaml:7: consistency: leased applies to fixed_window, sliding_window and token_bucket without calendar windows (algorithm is sliding_log); use consistency: exact"}},
		{"leased concurrency", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      algorithm: concurrency\n      consistency: leased\n"}, false,
			[]string{"a.yaml:7: consistency: leased applies to fixed_window, sliding_window and token_bucket without calendar windows (algorithm is concurrency)"}},
		{"leased calendar", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: month\n      calendar: true\n      consistency: leased\n"}, false,
			[]string{"a.yaml:7: consistency: leased applies to fixed_window, sliding_window and token_bucket without calendar windows (calendar: true)"}},
		{"bad consistency", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n      consistency: eventual\n"}, false,
			[]string{`a.yaml:6: invalid consistency "eventual": want exact or leased`}},
		{"calendar with minute", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: minute\n      calendar: true\n"}, false,
			[]string{"a.yaml:6: calendar: true applies to units month and year only (unit is minute)"}},
		{"calendar with token bucket", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: month\n      algorithm: token_bucket\n      calendar: true\n"}, false,
			[]string{"a.yaml:7: calendar: true applies to fixed_window and sliding_window only"}},
		{"early_warning on token bucket", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: minute\n      algorithm: token_bucket\n      early_warning: true\n"}, false,
			[]string{"a.yaml:7: early_warning applies to fixed_window and sliding_window only (algorithm is token_bucket)"}},
		{"early_warning share out of range", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: minute\n      early_warning: {used: 1.5, within: 0}\n"}, false,
			[]string{`a.yaml:6: early_warning.used must be a number above 0 and at most 1, got "1.5"`, `a.yaml:6: early_warning.within must be a number above 0 and at most 1, got "0"`}},
		{"early_warning not a mapping", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: minute\n      early_warning: [1]\n"}, false,
			[]string{"a.yaml:6: early_warning must be true, false or a mapping {used, within}"}},
		{"window too long", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: year\n      unit_multiplier: 101\n"}, false,
			[]string{"a.yaml:6: window year × 101 is longer than the maximum of 36500 days"}},
		{"token bucket out of bounds", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      algorithm: token_bucket\n      unit: year\n      unit_multiplier: 100\n      requests_per_unit: 1\n      burst: 4000000000\n"}, false,
			[]string{"a.yaml:4: rate limit out of bounds: token_bucket burst 4000000000"}},
		{"rate_limit and rate_limits", map[string]string{"a.yaml": head + "  - key: a\n    rate_limit:\n      unit: second\n    rate_limits:\n      - unit: day\n"}, false,
			[]string{"a.yaml:6: rate_limit (line 4) and rate_limits on the same descriptor"}},
		{"unlimited in rate_limits", map[string]string{"a.yaml": head + "  - key: a\n    rate_limits:\n      - unlimited: true\n"}, false,
			[]string{"a.yaml:5: unlimited is only allowed in rate_limit"}},
		{"empty rate_limits", map[string]string{"a.yaml": head + "  - key: a\n    rate_limits: []\n"}, false,
			[]string{"a.yaml:4: rate_limits must be a non-empty list"}},
		{"reserved key", map[string]string{"a.yaml": head + "  - key: ratelimitd.release\n"}, false,
			[]string{`a.yaml:3: descriptor key "ratelimitd.release" is reserved`}},
		{"metadata not a map", map[string]string{"a.yaml": head + "  - key: a\n    metadata: [1]\n"}, false,
			[]string{"a.yaml:4: metadata must be a mapping"}},
		{"metadata non-string key", map[string]string{"a.yaml": head + "  - key: a\n    metadata:\n      1: x\n"}, false,
			[]string{"a.yaml:5: key is not of type string"}},
		{"multi-error, every file", map[string]string{
			"a.yaml":     head + "  - key: a\n    rate_limit:\n      unit: sec\n  - key: \"\"\n  - key: b\n    value: c\n    share_threshold: true\n",
			"sub/b.yml":  "domain: e\nbogus: 1\n",
			"sub/c.txt":  "not yaml at all: [",
			"sub/d.yaml": "domain: f\ndescriptors:\n  - key: x\n    rate_limit:\n      unit: day\n      requests_per_unit: -5\n"}, false,
			[]string{`a.yaml:5: invalid rate limit unit "sec"`, "a.yaml:6: descriptor has empty key",
				"a.yaml:9: share_threshold requires", `sub/b.yml:2: unknown key "bogus"`, "sub/d.yaml:6: requests_per_unit must not be negative"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeFiles(t, c.files)
			s, _, err := Load(LoadOptions{MergeDomains: c.merge}, dir)
			if err == nil {
				t.Fatalf("Load succeeded, want errors %q", c.want)
			}
			if s != nil {
				t.Errorf("Set returned with an error")
			}
			var joined interface{ Unwrap() []error }
			if !errors.As(err, &joined) {
				t.Fatalf("error is not joined: %v", err)
			}
			got := joined.Unwrap()
			for _, e := range got {
				var ce *ConfigError
				if !errors.As(e, &ce) {
					t.Errorf("not a *ConfigError: %v", e)
				}
			}
			if len(got) != len(c.want) {
				t.Errorf("got %d errors, want %d:\n%v", len(got), len(c.want), err)
			}
			for _, w := range c.want {
				found := false
				for _, e := range got {
					if strings.HasPrefix(e.Error(), filepath.Join(dir, w[:strings.Index(w, ":")])) &&
						strings.Contains(e.Error(), w[strings.Index(w, ":"):]) {
						found = true
					}
				}
				if !found {
					t.Errorf("missing error %q in:\n%v", w, err)
				}
			}
		})
	}
}

func TestMergeDomains(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml": head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"b.yaml": head + "  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
	})
	if _, _, err := Load(LoadOptions{}, dir); err == nil || !strings.Contains(err.Error(), "duplicate domain") {
		t.Fatalf("without merge: err = %v", err)
	}
	s := mustLoad(t, LoadOptions{MergeDomains: true}, dir)
	runMatch(t, s, []matchCase{
		{"from a", "d", ents("k", "x"), "sec:1", ""},
		{"from b", "d", ents("j", "x"), "min:2", ""},
	})
}

func TestLoadWalk(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml":            "domain: a\n",
		"sub/b.YML":         "domain: b\n",
		"sub/readme.md":     "not: [yaml",
		".hidden/c.yaml":    "domain: c\n",
		"sub/.d.yaml":       "domain: d\n",
		"sub/deeper/e.yaml": "domain: e\n",
	})
	s := mustLoad(t, LoadOptions{IgnoreDotFiles: true}, dir)
	if got := strings.Join(s.Domains(), ","); got != "a,b,e" {
		t.Errorf("IgnoreDotFiles domains = %s", got)
	}
	s = mustLoad(t, LoadOptions{}, dir)
	if got := strings.Join(s.Domains(), ","); got != "a,b,c,d,e" {
		t.Errorf("domains = %s", got)
	}
	// A file path is loaded whatever its extension; repeated paths once.
	s = mustLoad(t, LoadOptions{}, filepath.Join(dir, "a.yaml"), filepath.Join(dir, "a.yaml"))
	if got := strings.Join(s.Domains(), ","); got != "a" {
		t.Errorf("file path domains = %s", got)
	}
	if _, _, err := Load(LoadOptions{}, filepath.Join(dir, "missing")); err == nil {
		t.Errorf("missing path loaded")
	}
	// Symlinked files are followed (ConfigMap layout).
	link := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, "a.yaml"), filepath.Join(link, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	s = mustLoad(t, LoadOptions{}, link)
	if !s.HasDomain("a") {
		t.Errorf("symlinked file not loaded")
	}
}

func TestWarnings(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": head +
		"  - key: path\n    value: /api/login\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n" +
		"  - key: X-Auth-Token\n    descriptors:\n      - key: user\n        rate_limits:\n          - unit: minute\n            algorithm: sliding_window\n          - unit: day\n" +
		"  - key: ok\n    rate_limit:\n      unit: minute\n"})
	_, warns, err := Load(LoadOptions{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 2 {
		t.Fatalf("warnings = %v", warns)
	}
	if warns[0].Line != 5 || !strings.Contains(warns[0].Message, `"/api/login"`) || !strings.Contains(warns[0].String(), "a.yaml:5: warning: fixed_window limit") {
		t.Errorf("warning 0 = %s", warns[0])
	}
	if warns[1].Line != 14 || !strings.Contains(warns[1].Message, "X-Auth-Token") {
		t.Errorf("warning 1 = %s", warns[1])
	}
}

func TestDropInStrings(t *testing.T) {
	// envoyproxy/ratelimit decodes ints and bools as strings for key/value.
	dir := writeFiles(t, map[string]string{"a.yaml": head + "  - key: code\n    value: 429\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n"})
	s := mustLoad(t, LoadOptions{}, dir)
	if _, ok := s.Match("d", ents("code", "429")); !ok {
		t.Errorf("int value did not match")
	}
}

// The fixed_window authentication lint matches whole words of keys and
// values, not substrings.
func TestAuthLintWholeWords(t *testing.T) {
	tests := []struct {
		key, value string
		warn       bool
	}{
		// Positives.
		{"path", "/api/login", true},
		{"path", "/v1/signIn", true},
		{"path", "/account/sign_in", true},
		{"path", "/Log-On", true},
		{"login_user", "", true},
		{"loginUser", "", true},
		{"x-auth-token", "", true},
		{"user", "password", true},
		{"passwd", "", true},
		{"pwd_reset", "", true},
		{"op", "authn", true},
		{"step", "OTPCode", true},
		{"step", "totp", true},
		{"step", "mfa-verify", true},
		{"step", "2FA", true},
		{"v1Login", "", true},
		{"route", "token", true},
		{"AUTH", "", true},
		{"endpoint", "/authenticate", true},
		// Negatives: substrings that are not authentication words.
		{"author_id", "", false},
		{"path", "/hotpath", false},
		{"llm_tokens", "", false},
		{"authz", "", false},
		{"Authorization", "", false},
		{"path", "/blog/authors", false},
		{"catalog", "", false},
		{"tenant", "signing-key", false},
		{"path", "/option", false},
		{"remote_address", "", false},
	}
	for _, tt := range tests {
		name := tt.key + "=" + tt.value
		t.Run(name, func(t *testing.T) {
			entry := "  - key: " + tt.key + "\n"
			if tt.value != "" {
				entry += "    value: " + tt.value + "\n"
			}
			dir := writeFiles(t, map[string]string{"a.yaml": head + entry + "    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n"})
			_, warns, err := Load(LoadOptions{}, dir)
			if err != nil {
				t.Fatal(err)
			}
			got := false
			for _, w := range warns {
				if strings.Contains(w.Message, "looks like authentication") {
					got = true
				}
			}
			if got != tt.warn {
				t.Errorf("warned %v, want %v (warnings %v)", got, tt.warn, warns)
			}
		})
	}
	// A sliding window on the same descriptor does not warn.
	dir := writeFiles(t, map[string]string{"a.yaml": head + "  - key: login\n    rate_limit:\n      unit: minute\n      algorithm: sliding_window\n      requests_per_unit: 5\n"})
	if _, warns, err := Load(LoadOptions{}, dir); err != nil || len(warns) != 0 {
		t.Errorf("sliding_window on login: warnings %v, err %v", warns, err)
	}
}

func TestWords(t *testing.T) {
	for in, want := range map[string]string{
		"/api/v1/signIn": "api v1 sign in",
		"OTPCode":        "otp code",
		"x-auth-token":   "x auth token",
		"2FA":            "2fa",
		"v1Login":        "v1 login",
		"llm_tokens":     "llm tokens",
		"":               "",
		"caf\u00e9Login": "caf login",
	} {
		if got := strings.Join(words(in), " "); got != want {
			t.Errorf("words(%q) = %q, want %q", in, got, want)
		}
	}
}

// A directory without config files is a valid, empty config with one
// warning; a missing path is an error; a config with a domain has no such
// warning.
func TestEmptyConfigWarning(t *testing.T) {
	empty := writeFiles(t, map[string]string{"README.txt": "not yaml"})
	s, warns, err := Load(LoadOptions{}, empty)
	if err != nil {
		t.Fatalf("empty directory: %v", err)
	}
	if len(s.Domains()) != 0 {
		t.Errorf("domains %v", s.Domains())
	}
	if len(warns) != 1 || warns[0].File != "" ||
		warns[0].String() != "warning: no rate-limit domains loaded from "+empty+" (no .yaml or .yml config files): every request is answered OK without limits" {
		t.Errorf("warnings = %q", warns)
	}
	if _, _, err := Load(LoadOptions{}, filepath.Join(empty, "gone.yaml")); err == nil {
		t.Error("missing file: no error")
	}
	full := writeFiles(t, map[string]string{"a.yaml": head + "  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n"})
	if _, warns, err := Load(LoadOptions{}, empty, full); err != nil || len(warns) != 0 {
		t.Errorf("with a domain: warnings %v, err %v", warns, err)
	}
}

// TestLoadSourceHash: SourceHash changes with any byte, file name or file
// set change, and only then; Hash (the compiled content) ignores comments.
func TestLoadSourceHash(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n"})
	load := func() *Set {
		t.Helper()
		s, _, err := Load(LoadOptions{}, dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := load()
	if h := a.SourceHash(); len(h) != 64 || h != load().SourceHash() {
		t.Fatalf("SourceHash %q, want 64 hex digits equal across loads of the same files", h)
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: one # comment\n")
	b := load()
	if b.SourceHash() == a.SourceHash() || b.Hash() != a.Hash() {
		t.Errorf("comment added: SourceHash %s -> %s (want a change), Hash %s -> %s (want none)", a.SourceHash(), b.SourceHash(), a.Hash(), b.Hash())
	}
	if err := os.Rename(filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	if c := load(); c.SourceHash() == b.SourceHash() {
		t.Errorf("file renamed: SourceHash unchanged")
	}
	write(t, filepath.Join(dir, "notes.txt"), "not config\n")
	c := load()
	write(t, filepath.Join(dir, "notes.txt"), "still not config\n")
	if d := load(); d.SourceHash() != c.SourceHash() {
		t.Errorf("a file the loader does not read changed SourceHash")
	}
	s, _, err := Load(LoadOptions{Keys: KeyOptions{Prefix: "p"}}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.SourceHash() == c.SourceHash() {
		t.Errorf("other LoadOptions, same SourceHash")
	}
	if (*Set)(nil).SourceHash() != "" {
		t.Errorf("nil Set has a SourceHash")
	}
}

// TestIsReadError: read problems (a missing path, an unreadable file) are
// read errors; a config problem, alone or with read problems, is not.
func TestIsReadError(t *testing.T) {
	dir := writeFiles(t, map[string]string{"bad.yaml": "domain: [broken\n"})
	missing := filepath.Join(dir, "missing.yaml")
	_, _, err := Load(LoadOptions{}, missing)
	if !IsReadError(err) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing path: %v: IsReadError %t, want true (wrapping fs.ErrNotExist)", err, IsReadError(err))
	}
	if !IsReadError(fmt.Errorf("wrapped: %w", err)) {
		t.Errorf("wrapped read error not recognised")
	}
	// A dangling symlink under a directory is a file the loader cannot read.
	ddir := t.TempDir()
	if err := os.Symlink("nowhere.yaml", filepath.Join(ddir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(LoadOptions{}, ddir); !IsReadError(err) {
		t.Errorf("dangling symlink: %v: IsReadError false, want true", err)
	}
	_, _, err = Load(LoadOptions{}, filepath.Join(dir, "bad.yaml"))
	if err == nil || IsReadError(err) {
		t.Errorf("syntax error: %v: IsReadError %t, want an error that is not a read error", err, IsReadError(err))
	}
	_, _, err = Load(LoadOptions{}, filepath.Join(dir, "bad.yaml"), missing)
	if err == nil || IsReadError(err) {
		t.Errorf("syntax and read errors: %v: IsReadError %t, want false", err, IsReadError(err))
	}
	for _, e := range []error{nil, errors.New("x"), errors.Join(errors.New("y")), &WatchError{Err: errors.New("x")}} {
		if IsReadError(e) {
			t.Errorf("IsReadError(%v) = true", e)
		}
	}
}

// configMapDir lays out files as the kubelet mounts a ConfigMap: the
// files in ..<timestamp>/, a ..data symlink to it, and a top-level
// symlink ..data/<name> per file.
func configMapDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := filepath.Join(dir, "..2026_12_01_00_00_00.000000001")
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A ConfigMap-shaped directory loads once with IgnoreDotFiles; without it
// every file is loaded twice, and the duplicate-domain error points at
// the dot directory and the ignore-dotfiles option, not at merge-domains.
func TestLoadConfigMapDir(t *testing.T) {
	dir := configMapDir(t, map[string]string{"a.yaml": head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"})
	s := mustLoad(t, LoadOptions{IgnoreDotFiles: true}, dir)
	if got := strings.Join(s.Domains(), ","); got != "d" || len(s.Rules()) != 1 {
		t.Errorf("domains %q, %d rules; want d, 1", got, len(s.Rules()))
	}
	_, _, err := Load(LoadOptions{}, dir)
	if err == nil || !strings.Contains(err.Error(), "duplicate domain") || !strings.Contains(err.Error(), "set the ignore-dotfiles option") ||
		!strings.Contains(err.Error(), "--ignore-dotfiles") || !strings.Contains(err.Error(), "RUNTIME_IGNOREDOTFILES=true") ||
		strings.Contains(err.Error(), "merge-domains") {
		t.Errorf("without IgnoreDotFiles: %v; want the duplicate with the ignore-dotfiles hint", err)
	}
	// Two ordinary files (under a dot directory they share) keep the
	// merge-domains hint.
	plain := writeFiles(t, map[string]string{".shared/x/a.yaml": "domain: d\n", ".shared/x/b.yaml": "domain: d\n"})
	_, _, err = Load(LoadOptions{}, filepath.Join(plain, ".shared", "x"))
	if err == nil || !strings.Contains(err.Error(), "set the merge-domains option") {
		t.Errorf("plain duplicate: %v; want the merge-domains hint", err)
	}
}

// A file named twice loads once; with RepeatPaths (envoyproxy/ratelimit
// loads every file it is given) twice, which is a duplicate domain, or
// with MergeDomains a duplicate key, as in the reference's own config
// tests. A file and its directory count as naming it twice.
func TestLoadRepeatPaths(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"})
	f := filepath.Join(dir, "a.yaml")
	for _, merge := range []bool{false, true} {
		s := mustLoad(t, LoadOptions{MergeDomains: merge}, f, f, dir)
		if len(s.Rules()) != 1 {
			t.Errorf("merge %t, each file once: %d rules, want 1", merge, len(s.Rules()))
		}
	}
	want := map[bool]string{false: "duplicate domain", true: "duplicate descriptor composite key 'test-domain.key1_value1'"}
	for _, paths := range [][]string{{f, f}, {dir, f}, {f, filepath.Join(dir, ".", "a.yaml")}} {
		for merge, msg := range want {
			_, _, err := Load(LoadOptions{MergeDomains: merge, RepeatPaths: true}, paths...)
			if err == nil || !strings.Contains(err.Error(), msg) {
				t.Errorf("RepeatPaths, merge %t, %v: %v; want %q", merge, paths, err, msg)
			}
		}
	}
}
