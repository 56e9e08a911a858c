package policy

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// yamlLineRE finds the line number in a yaml.v3 error message.
var yamlLineRE = regexp.MustCompile(`line (\d+)`)

// yamlError reports a yaml.v3 decoding error of data as "YAML syntax
// error: ..." without yaml.v3's own prefix, at the line of the offending
// token (yamlProblemLine).
func (p *parser) yamlError(data []byte, err error) {
	line := 0
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	msg = yamlLineRE.ReplaceAllString(msg, "")
	msg = strings.TrimPrefix(msg, ": ")
	p.errs.add(p.file, yamlProblemLine(data, line, msg), "YAML syntax error: %s", msg)
}

// yamlProblemLine returns the 1-based line of the token a syntax error
// stopped at. yaml.v3 names the line where the enclosing block began (for
// parser errors counted from 0), so the offending line is found by
// bisection: the smallest prefix of the file, in whole lines from the
// reported one on, that fails with the same problem ends with it. An
// unclosed flow collection ({...} or [...]) is the exception: its opening
// bracket is the problem, and parsing the file one blank line down makes
// yaml.v3 name the bracket's 1-based line. reported is the line yaml.v3
// named (0 if none) and problem its message without the line.
func yamlProblemLine(data []byte, reported int, problem string) int {
	if strings.HasPrefix(problem, "did not find expected ',' or ") {
		err := decodeDocs(append([]byte("\n"), data...))
		if err != nil && strings.HasSuffix(err.Error(), problem) {
			if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
				line, _ := strconv.Atoi(m[1])
				return line
			}
		}
		return reported + 1
	}
	ends := lineEnds(data)
	lo, hi := max(reported, 1), len(ends)
	if lo > hi {
		return reported
	}
	sameProblem := func(n int) bool {
		err := decodeDocs(data[:ends[n-1]])
		return err != nil && strings.HasSuffix(err.Error(), problem)
	}
	if !sameProblem(hi) {
		return reported
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if sameProblem(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// lineEnds returns the offset just past each line of data (its newline,
// or the end of data for a last line without one).
func lineEnds(data []byte) []int {
	var ends []int
	for i, c := range data {
		if c == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	return ends
}

// decodeDocs decodes the first two YAML documents of data as parseFile
// does and returns the first syntax error, or nil.
func decodeDocs(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for range 2 {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return nil
}

// deref follows alias nodes to the node they stand for.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// isNull reports an absent value or an explicit YAML null.
func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// listKindName is kindName, saying "an empty list" for an empty sequence.
func listKindName(n *yaml.Node) string {
	if n.Kind == yaml.SequenceNode && len(n.Content) == 0 {
		return "an empty list"
	}
	return kindName(n)
}

// kindName describes a node for error messages: "a mapping", "a list",
// "null", or the scalar's tag and quoted value (`int "3"`).
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return strings.TrimPrefix(n.Tag, "!!") + " " + strconv.Quote(n.Value)
	}
	return "an unsupported YAML node"
}

// mapping calls f for each key of a mapping node in order, reporting
// non-string and duplicate keys. YAML merge keys (`<<: *alias` or
// `<<: [*a, *b]`, tag !!merge) are expanded as yaml.v2 (and so
// envoyproxy/ratelimit) resolves them: see pairs.
func (p *parser) mapping(m *yaml.Node, f func(k string, kn, v *yaml.Node)) {
	kv := p.pairs(m)
	seen := make(map[string]int, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		kn, v := kv[i], kv[i+1]
		if kn.Kind != yaml.ScalarNode || kn.Tag != "!!str" {
			p.errs.add(p.file, kn.Line, "key is not of type string: %s", kindName(kn))
			continue
		}
		if first, dup := seen[kn.Value]; dup {
			p.errs.add(p.file, kn.Line, "duplicate key %q (first at line %d)", kn.Value, first)
			continue
		}
		seen[kn.Value] = kn.Line
		f(kn.Value, kn, v)
	}
}

// str decodes a scalar as a string (ints and bools keep their YAML text, as
// envoyproxy/ratelimit's decoder does). Null gives "", true.
func (p *parser) str(v *yaml.Node, field string) (string, bool) {
	if isNull(v) {
		return "", true
	}
	if v.Kind != yaml.ScalarNode {
		p.errs.add(p.file, v.Line, "%s must be a string, got %s", field, kindName(v))
		return "", false
	}
	return v.Value, true
}

// boolean decodes a YAML boolean scalar; anything else is reported and
// gives false.
func (p *parser) boolean(v *yaml.Node, field string) bool {
	var b bool
	if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil {
		p.errs.add(p.file, v.Line, "%s must be true or false, got %s", field, kindName(v))
		return false
	}
	return b
}

// digitsRE matches a plain decimal integer of any size.
var digitsRE = regexp.MustCompile(`^[-+]?[0-9][0-9_]*$`)

// integer decodes a non-negative integer no larger than max.
func (p *parser) integer(v *yaml.Node, field string, min, max int64) (int64, bool) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!float" && digitsRE.MatchString(v.Value) {
		// YAML resolves an integer beyond int64 as a float.
		if strings.HasPrefix(v.Value, "-") {
			p.errs.add(p.file, v.Line, "%s must not be negative, got %s", field, v.Value)
		} else {
			p.errs.add(p.file, v.Line, "%s: %s is out of range (maximum %d)", field, v.Value, max)
		}
		return 0, false
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		p.errs.add(p.file, v.Line, "%s must be an integer, got %s", field, kindName(v))
		return 0, false
	}
	var i int64
	if err := v.Decode(&i); err != nil {
		p.errs.add(p.file, v.Line, "%s: %q is out of range (maximum %d)", field, v.Value, max)
		return 0, false
	}
	if i < min {
		if i < 0 {
			p.errs.add(p.file, v.Line, "%s must not be negative, got %d", field, i)
		} else {
			p.errs.add(p.file, v.Line, "%s must be at least %d, got %d", field, min, i)
		}
		return 0, false
	}
	if i > max {
		p.errs.add(p.file, v.Line, "%s: %d is out of range (maximum %d)", field, i, max)
		return 0, false
	}
	return i, true
}
