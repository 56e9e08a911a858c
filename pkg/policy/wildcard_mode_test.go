package policy

import "testing"

const wildcardModesConfig = `domain: w
descriptors:
  - key: mid
    value: "bar*b"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: multi
    value: "foo*bar*baz*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tail
    value: "pre*"
    rate_limit: {unit: day, requests_per_unit: 3}
`

// TestWildcardsReferenceMode: with LiteralValues (reference mode) only a
// trailing '*' is a wildcard, a prefix match on the rest taken as text;
// natively every '*' matches any run of bytes.
func TestWildcardsReferenceMode(t *testing.T) {
	ref, _, err := LoadSources(LoadOptions{LiteralValues: true}, Source{Name: "t.yaml", Data: []byte(wildcardModesConfig)})
	if err != nil {
		t.Fatal(err)
	}
	runMatch(t, ref, []matchCase{
		{"inner '*' is literal: other text", "w", ents("mid", "barXb"), "", ""},
		{"inner '*' is literal: same text", "w", ents("mid", "bar*b"), "min:1", "w.mid_bar*b"},
		{"several '*': not a glob", "w", ents("multi", "fooXbarYbazZ"), "", ""},
		{"several '*': literal prefix", "w", ents("multi", "foo*bar*bazZ"), "hou:2", "w.multi_foo*bar*baz*"},
		{"trailing '*'", "w", ents("tail", "prefix"), "day:3", "w.tail_pre*"},
	})
	native, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(wildcardModesConfig)})
	if err != nil {
		t.Fatal(err)
	}
	runMatch(t, native, []matchCase{
		{"inner '*' matches", "w", ents("mid", "barXb"), "min:1", "w.mid_bar*b"},
		{"several '*' glob", "w", ents("multi", "fooXbarYbazZ"), "hou:2", "w.multi_foo*bar*baz*"},
		{"trailing '*'", "w", ents("tail", "prefix"), "day:3", "w.tail_pre*"},
	})
}
