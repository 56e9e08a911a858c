package policy

import (
	"fmt"
	"strings"
	"testing"
)

// TestYAMLSyntaxErrorLine: a YAML syntax error is reported at the line of
// the offending token, not at the line where the enclosing block began
// (yaml.v3's message, counted from 0 for parser errors).
func TestYAMLSyntaxErrorLine(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		line       int
		msg        string
	}{
		{"dedented key", "domain: example\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n     requests_per_unit: 5\n", 6, "did not find expected key"},
		{"indented key", "domain: example\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n       requests_per_unit: 5\n", 6, "mapping values are not allowed"},
		{"item off the list", "domain: example\ndescriptors:\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 5}\n   - key: c\n", 6, "did not find expected '-' indicator"},
		{"key between levels", "domain: example\ndescriptors:\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 5}\n  key: c\n", 6, "did not find expected '-' indicator"},
		{"tab", "domain: example\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n\trequests_per_unit: 5\n", 6, "found a tab character"},
		{"unclosed quote", "domain: example\ndescriptors:\n  - key: a\n    value: \"abc\n    rate_limit:\n      unit: second\n", 4, "found unexpected end of stream"},
		{"quote closed, next one not", "domain: example\ndescriptors:\n  - key: a\n    value: \"ab\n      c\"\n  - key: b\n    value: \"d\n", 7, "found unexpected end of stream"},
		{"unclosed flow list", "domain: d\ndescriptors:\n  - key: a\n    value: [b\n", 4, "did not find expected ',' or ']'"},
		{"unclosed flow mapping", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second,\n      requests_per_unit: 5\n  - key: b\n", 4, "did not find expected ',' or '}'"},
		{"unclosed flow on the first line", "domain: [broken\ndescriptors: []\n", 1, "did not find expected ',' or ']'"},
		{"unclosed flow on the first line, alone", "domain: [broken\n", 1, "did not find expected ',' or ']'"},
		{"error in the second document", "domain: d\n---\ndomain: e\n  x: y\n", 4, "mapping values are not allowed"},
		{"reserved character", "domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: b\n    value: @x\n", 6, "found character that cannot start any token"},
		{"unknown alias", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &a {unit: second, requests_per_unit: 5}\n  - key: b\n    rate_limit: *zz\n", 6, "unknown anchor 'zz' referenced"},
		{"list item under a mapping", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n    - key: b\n", 7, "did not find expected key"},
		{"duplicate key", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    key: b\n", 5, `duplicate key "key" (first at line 3)`},
		{"no final newline", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n     requests_per_unit: 5", 6, "did not find expected key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, errs := loadOne(t, c.yaml)
			want := fmt.Sprintf("x.yaml:%d: ", c.line)
			if len(errs) != 1 || !strings.HasPrefix(errs[0], want) || !strings.Contains(errs[0], c.msg) {
				t.Errorf("errors %q, want one %q...%q\n%s", errs, want, c.msg, numbered(c.yaml))
			}
		})
	}
}

// TestYAMLSyntaxErrorLineAnywhere moves the second key of a rate_limit
// one column left and one right, at every position of a long config: each
// time the error names its line.
func TestYAMLSyntaxErrorLineAnywhere(t *testing.T) {
	var lines []string
	lines = append(lines, "domain: d", "descriptors:")
	for i := range 40 {
		lines = append(lines, fmt.Sprintf("  - key: k%d", i), "    rate_limit:", "      unit: second", fmt.Sprintf("      requests_per_unit: %d", i+1))
	}
	n := 0
	for i, l := range lines {
		if !strings.HasPrefix(l, "      requests_per_unit") {
			continue
		}
		for _, moved := range []string{l[1:], " " + l} {
			bad := append([]string(nil), lines...)
			bad[i] = moved
			_, _, errs := loadOne(t, strings.Join(bad, "\n")+"\n")
			want := fmt.Sprintf("x.yaml:%d: YAML syntax error", i+1)
			if len(errs) != 1 || !strings.HasPrefix(errs[0], want) {
				t.Errorf("bad indent on line %d: errors %q, want %q", i+1, errs, want)
			}
			n++
		}
	}
	if n != 80 {
		t.Fatalf("%d cases, want 80", n)
	}
}

func numbered(s string) string {
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		fmt.Fprintf(&b, "%3d| %s\n", i+1, l)
	}
	return b.String()
}
