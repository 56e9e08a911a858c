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

// descFields holds what descriptor needs of a descriptor mapping beyond the
// node itself: the key lines its cross-field checks report at (0 when the
// key is absent) and the raw metadata node.
type descFields struct {
	hasKey       bool
	limits       []rawLimit
	rlLine       int // rate_limit:
	rlsLine      int // rate_limits:
	shareLine    int // share_threshold:
	overrideLine int // override:
	countingLine int // counting:
	valueLine    int // value:
	meta         *yaml.Node
}

// descriptor parses one descriptor mapping into a node (nil when the
// file's node budget is spent); problems are reported to p.errs and the
// node is returned anyway, so that one run reports every problem.
func (p *parser) descriptor(m *yaml.Node) *node {
	if !p.spend(m) {
		return nil
	}
	n := &node{line: m.Line, file: p.file}
	var f descFields
	p.mapping(m, func(k string, kn, v *yaml.Node) { p.descriptorField(n, &f, k, kn, v) })
	if !f.hasKey {
		p.errs.add(p.file, m.Line, "descriptor has empty key: key is required")
	}
	p.checkDescriptor(&f)
	if n.cgnat != nil && f.rlLine == 0 && f.rlsLine == 0 {
		p.errs.add(p.file, n.cgnat.Line, "cgnat applies to the limits of its descriptor, which has no rate_limit or rate_limits")
	}
	if n.penalty != nil && f.rlLine == 0 && f.rlsLine == 0 {
		p.errs.add(p.file, n.penalty.line, "penalty applies to the limits of its descriptor, which has no rate_limit or rate_limits")
	}
	if n.reserve != nil && f.rlLine == 0 && f.rlsLine == 0 {
		p.errs.add(p.file, n.reserve.Line, "reserve applies to the limits of its descriptor, which has no rate_limit or rate_limits")
	}
	n.classify()
	if n.kind == valueCIDR && p.literal {
		n.kind = valueExact // the reference compares values as strings
	}
	if n.kind == valuePattern && p.literal {
		// The reference's only wildcard is a trailing '*', a prefix match
		// on the rest of the value taken literally ("foo*bar*" matches
		// "foo*bar" and what follows); any other '*' is plain text.
		if prefix, ok := strings.CutSuffix(n.value, "*"); ok {
			n.pat = prefixPattern(prefix)
		} else {
			n.kind = valueExact
		}
	}
	if n.kind == valueCIDR {
		p.cidr(n, f.valueLine)
	} else if n.kind == valueExact && !p.literal && prefixLike(n.value) {
		p.prefixTypo(n.value, f.valueLine)
	}
	if n.share && n.kind != valuePattern && n.kind != valueCIDR {
		p.errs.add(p.file, f.shareLine, "share_threshold requires a value with a '*' wildcard or a CIDR prefix (value is %q)", n.value)
	}
	if f.meta != nil {
		md := p.metadata(f.meta)
		if mm, ok := md.(map[string]any); ok {
			n.metadata = mm
		} else if md != nil || !isNull(f.meta) {
			p.errs.add(p.file, f.meta.Line, "metadata must be a mapping, got %s", kindName(f.meta))
		}
	}
	n.limits = f.limits
	return n
}

// descriptorField parses the descriptor key k (key node kn, value v) into
// n, or into f for what is checked once the whole mapping is read.
func (p *parser) descriptorField(n *node, f *descFields, k string, kn, v *yaml.Node) {
	switch k {
	case "key":
		f.hasKey = true
		n.keyLine = kn.Line
		n.key, _ = p.str(v, "key")
		switch n.key {
		case "":
			p.errs.add(p.file, kn.Line, "descriptor has empty key")
		case ReleaseKey:
			p.errs.add(p.file, v.Line, "descriptor key %q is reserved for concurrency lease releases", ReleaseKey)
		}
	case "value":
		f.valueLine = v.Line
		n.value, _ = p.str(v, "value")
	case "ipv6_prefix":
		n.ipv6Prefix = p.ipv6Prefix(v)
	case "cgnat":
		n.cgnat = p.cgnat(kn, v)
	case "reserve":
		n.reserve = p.reserve(kn, v)
	case "penalty":
		n.penalty = p.penalty(kn, v)
	case "rate_limit":
		f.rlLine = kn.Line
		if isNull(v) {
			p.errs.add(p.file, v.Line, "rate_limit must be a mapping, got null")
			return
		}
		if l, ok := p.limit(v, kn.Line, "rate_limit"); ok {
			f.limits = append(f.limits, l)
		}
	case "rate_limits":
		f.rlsLine = kn.Line
		f.limits = append(f.limits, p.rateLimits(v)...)
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
			f.shareLine = kn.Line
		}
	case "metadata":
		f.meta = v
	case "override":
		f.overrideLine = kn.Line
		n.override = p.overrideField(kn, v, false)
	case "counting":
		f.countingLine = kn.Line
		if c, ok := p.counting(v); ok {
			n.counting = c
		}
	default:
		p.unknown(kn, k, "descriptor", descHints, descKeys)
	}
}

// rateLimits parses a `rate_limits:` list; items that fail to parse, and
// unlimited items (allowed in rate_limit only), are reported and left out.
func (p *parser) rateLimits(v *yaml.Node) []rawLimit {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.errs.add(p.file, v.Line, "rate_limits must be a non-empty list of rate_limit mappings, got %s", listKindName(v))
		return nil
	}
	var limits []rawLimit
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
	return limits
}

// checkDescriptor reports the problems between fields of one descriptor:
// two limits with one name, counting or override without a limit, and
// rate_limit next to rate_limits.
func (p *parser) checkDescriptor(f *descFields) {
	names := map[string]int{}
	for _, l := range f.limits {
		if l.name == "" {
			continue
		}
		if first, dup := names[l.name]; dup {
			p.errs.add(p.file, l.nameLine, "rate_limits: two limits named %q on one descriptor (first at line %d): RateLimit-Policy could not tell them apart", l.name, first)
			continue
		}
		names[l.name] = l.nameLine
	}
	noLimit := f.rlLine == 0 && f.rlsLine == 0
	if f.countingLine != 0 && noLimit {
		p.errs.add(p.file, f.countingLine, "counting applies to the limits of its descriptor, which has no rate_limit or rate_limits")
	}
	if f.overrideLine != 0 && noLimit {
		p.errs.add(p.file, f.overrideLine, "override applies to the rule of its descriptor, which has no rate_limit or rate_limits (set it at the top level of the file for the whole domain)")
	}
	if f.rlLine != 0 && f.rlsLine != 0 {
		p.errs.add(p.file, f.rlsLine, "rate_limit (line %d) and rate_limits on the same descriptor; use rate_limits only", f.rlLine)
	}
}

// classify sets n's value kind and stat key segment from its key and
// value: "key" without a value, "key_value" with one ('*' makes it a
// pattern, an IP address before a '/' a CIDR prefix).
func (n *node) classify() {
	switch {
	case n.value == "":
		n.kind = valueNone
		n.seg = n.key
	case cidrValue(n.value):
		n.kind = valueCIDR
		n.seg = n.key + "_" + n.value
	case strings.Contains(n.value, "*"):
		n.kind = valuePattern
		n.pat = compilePattern(n.value)
		n.seg = n.key + "_" + n.value
	default:
		n.kind = valueExact
		n.seg = n.key + "_" + n.value
	}
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
			if b, ok := decodeAs[bool](v); ok {
				return b
			}
		case "!!int":
			if i, ok := decodeAs[int64](v); ok {
				return i
			}
			if f, ok := decodeAs[float64](v); ok {
				return f // an integer beyond int64
			}
		case "!!float":
			if f, ok := decodeAs[float64](v); ok {
				return f
			}
		}
		return v.Value
	}
	return nil
}

// decodeAs decodes scalar v as a T; ok is false when it does not fit.
func decodeAs[T any](v *yaml.Node) (T, bool) {
	var x T
	err := v.Decode(&x)
	return x, err == nil
}
