package policy

import (
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// descriptors parses a list of descriptor mappings. parent is nil at the
// top level.
func (p *parser) descriptors(v *yaml.Node, parent *node) []*node {
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		p.errs.add(p.file, v.Line, "descriptors must be a list of mappings, got %s", kindName(v))
		return nil
	}
	var out []*node
	for _, it := range v.Content {
		it = deref(it)
		if it.Kind != yaml.MappingNode {
			p.errs.add(p.file, it.Line, "descriptors: list of type other than map: item is %s", kindName(it))
			continue
		}
		if n := p.descriptor(it); n != nil {
			out = append(out, n)
		}
	}
	return out
}

func (p *parser) descriptor(m *yaml.Node) *node {
	if !p.spend(m) {
		return nil
	}
	n := &node{line: m.Line, file: p.file}
	var hasKey bool
	var limits []rawLimit
	var rlLine, rlsLine int
	var shareLine, overrideLine, countingLine int
	var meta *yaml.Node
	p.mapping(m, func(k string, kn, v *yaml.Node) {
		switch k {
		case "key":
			hasKey = true
			n.keyLine = kn.Line
			n.key, _ = p.str(v, "key")
			switch n.key {
			case "":
				p.errs.add(p.file, kn.Line, "descriptor has empty key")
			case ReleaseKey:
				p.errs.add(p.file, v.Line, "descriptor key %q is reserved for concurrency lease releases", ReleaseKey)
			}
		case "value":
			n.value, _ = p.str(v, "value")
		case "rate_limit":
			rlLine = kn.Line
			if isNull(v) {
				p.errs.add(p.file, v.Line, "rate_limit must be a mapping, got null")
				return
			}
			if l, ok := p.limit(v, kn.Line, "rate_limit"); ok {
				limits = append(limits, l)
			}
		case "rate_limits":
			rlsLine = kn.Line
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
				p.errs.add(p.file, v.Line, "rate_limits must be a non-empty list of rate_limit mappings, got %s", listKindName(v))
				return
			}
			for i, it := range v.Content {
				it = deref(it)
				l, ok := p.limit(it, it.Line, "rate_limits["+strconv.Itoa(i)+"]")
				if !ok {
					continue
				}
				if l.unlimited {
					p.errs.add(p.file, l.unlimitedLine, "unlimited is only allowed in rate_limit, not in rate_limits")
					continue
				}
				limits = append(limits, l)
			}
		case "descriptors":
			n.children = p.descriptors(v, n)
		case "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold":
			b := p.boolean(v, k)
			switch k {
			case "shadow_mode":
				n.shadow = b
			case "quota_mode":
				n.quota = b
			case "detailed_metric":
				n.detailed = b
			case "value_to_metric":
				n.valueToMetric = b
			case "share_threshold":
				n.share = b
				shareLine = kn.Line
			}
		case "metadata":
			meta = v
		case "override":
			overrideLine = kn.Line
			n.override = p.overrideField(kn, v, false)
		case "counting":
			countingLine = kn.Line
			s, ok := p.str(v, "counting")
			if !ok {
				return
			}
			c, err := ParseCounting(s)
			if err != nil {
				p.errs.add(p.file, v.Line, "invalid counting %q: want all_or_nothing or always_charge", s)
				return
			}
			n.counting = c
		default:
			p.unknown(kn, k, "descriptor", descHints, descKeys)
		}
	})
	if !hasKey {
		p.errs.add(p.file, m.Line, "descriptor has empty key: key is required")
	}
	names := map[string]int{}
	for _, l := range limits {
		if l.name == "" {
			continue
		}
		if first, dup := names[l.name]; dup {
			p.errs.add(p.file, l.nameLine, "rate_limits: two limits named %q on one descriptor (first at line %d): RateLimit-Policy could not tell them apart", l.name, first)
			continue
		}
		names[l.name] = l.nameLine
	}
	if countingLine != 0 && rlLine == 0 && rlsLine == 0 {
		p.errs.add(p.file, countingLine, "counting applies to the limits of its descriptor, which has no rate_limit or rate_limits")
	}
	if overrideLine != 0 && rlLine == 0 && rlsLine == 0 {
		p.errs.add(p.file, overrideLine, "override applies to the rule of its descriptor, which has no rate_limit or rate_limits (set it at the top level of the file for the whole domain)")
	}
	if rlLine != 0 && rlsLine != 0 {
		p.errs.add(p.file, rlsLine, "rate_limit (line %d) and rate_limits on the same descriptor; use rate_limits only", rlLine)
	}
	switch {
	case n.value == "":
		n.kind = valueNone
		n.seg = n.key
	case strings.Contains(n.value, "*"):
		n.kind = valuePattern
		n.pat = compilePattern(n.value)
		n.seg = n.key + "_" + n.value
	default:
		n.kind = valueExact
		n.seg = n.key + "_" + n.value
	}
	if n.share && n.kind != valuePattern {
		p.errs.add(p.file, shareLine, "share_threshold requires a value with a '*' wildcard (value is %q)", n.value)
	}
	if meta != nil {
		md := p.metadata(meta)
		if mm, ok := md.(map[string]any); ok {
			n.metadata = mm
		} else if md != nil || !isNull(meta) {
			p.errs.add(p.file, meta.Line, "metadata must be a mapping, got %s", kindName(meta))
		}
	}
	n.limits = limits
	return n
}

// metadata converts a YAML node to JSON-compatible values: map[string]any,
// []any, string, bool, int64, float64, nil.
func (p *parser) metadata(v *yaml.Node) any {
	v = deref(v)
	if !p.spend(v) {
		return nil
	}
	switch v.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(v.Content)/2)
		p.mapping(v, func(k string, _, val *yaml.Node) { m[k] = p.metadata(val) })
		return m
	case yaml.SequenceNode:
		s := make([]any, 0, len(v.Content))
		for _, it := range v.Content {
			s = append(s, p.metadata(it))
		}
		return s
	case yaml.ScalarNode:
		switch v.Tag {
		case "!!null":
			return nil
		case "!!bool":
			var b bool
			if v.Decode(&b) == nil {
				return b
			}
		case "!!int":
			var i int64
			if v.Decode(&i) == nil {
				return i
			}
			var f float64
			if v.Decode(&f) == nil {
				return f
			}
		case "!!float":
			var f float64
			if v.Decode(&f) == nil {
				return f
			}
		}
		return v.Value
	}
	return nil
}
