package policy

import (
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// The per-rule options that are enums or lists: a rate_limit's algorithm,
// failure_mode, store and replaces, a descriptor's counting. override: is parsed
// in override.go.

// algorithm parses a rate_limit `algorithm:` (fixed_window, sliding_window,
// sliding_log, token_bucket or concurrency; case-sensitive). ok is false,
// reported, for anything else.
func (p *parser) algorithm(v *yaml.Node) (algo.Kind, bool) {
	s, _ := p.str(v, "algorithm")
	a, ok := parseAlgorithm(s)
	if !ok {
		p.errs.add(p.file, v.Line, "invalid algorithm %q: want fixed_window, sliding_window, sliding_log, token_bucket or concurrency", s)
	}
	return a, ok
}

// failureMode parses a `failure_mode:` (open, closed or local;
// case-sensitive) of a rate_limit or of a domain's override (field names
// it in the message). ok is false, reported, for anything else.
func (p *parser) failureMode(v *yaml.Node, field string) (FailureMode, bool) {
	s, _ := p.str(v, field)
	f, ok := parseFailureMode(s)
	if !ok {
		p.errs.add(p.file, v.Line, "invalid %s %q: want open, closed or local", field, s)
	}
	return f, ok
}

// store parses a rate_limit `store:` (fast or durable; case-sensitive).
// ok is false, reported, for anything else.
func (p *parser) store(v *yaml.Node) (StoreKind, bool) {
	s, _ := p.str(v, "store")
	switch s {
	case "fast":
		return StoreFast, true
	case "durable":
		return StoreDurable, true
	}
	p.errs.add(p.file, v.Line, "invalid store %q: want fast or durable", s)
	return StoreFast, false
}

// counting parses a descriptor `counting:` (all_or_nothing or
// always_charge, see ParseCounting). ok is false, reported, for anything
// else.
func (p *parser) counting(v *yaml.Node) (Counting, bool) {
	s, ok := p.str(v, "counting")
	if !ok {
		return CountingDefault, false
	}
	c, err := ParseCounting(s)
	if err != nil {
		p.errs.add(p.file, v.Line, "invalid counting %q: want all_or_nothing or always_charge", s)
		return CountingDefault, false
	}
	return c, true
}

// replaces parses a rate_limit `replaces:` list of {name: ...} mappings
// into l.replaces and l.replacesLines (the line of each name). Null is an
// empty list; items that are not mappings or have an empty name are
// reported and left out.
func (p *parser) replaces(v *yaml.Node, l *rawLimit) {
	if isNull(v) {
		return
	}
	if v.Kind != yaml.SequenceNode {
		p.errs.add(p.file, v.Line, "replaces must be a list of {name: ...} mappings, got %s", kindName(v))
		return
	}
	for _, it := range v.Content {
		it = deref(it)
		if it.Kind != yaml.MappingNode {
			p.errs.add(p.file, it.Line, "replaces: list of type other than map: item is %s", kindName(it))
			continue
		}
		name, line := "", it.Line
		p.mapping(it, func(k string, kn, v *yaml.Node) {
			if k != "name" {
				p.unknown(kn, k, "replaces item", nil, replacesKeys)
				return
			}
			line = kn.Line
			name, _ = p.str(v, "replaces name")
		})
		if name == "" {
			p.errs.add(p.file, line, "replaces: name must not be empty")
			continue
		}
		l.replaces = append(l.replaces, name)
		l.replacesLines = append(l.replacesLines, line)
	}
}
