package policy

// The YAML nodes the plans expansion builds.

import "gopkg.in/yaml.v3"

// hasKey reports whether mapping m has the key k (merge keys not
// expanded: call it on a flat mapping).
func hasKey(m *yaml.Node, k string) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == k {
			return true
		}
	}
	return false
}

// isUnlimited reports whether rate_limit mapping m sets unlimited: true.
func isUnlimited(m *yaml.Node) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "unlimited" && m.Content[i+1].Value == "true" {
			return true
		}
	}
	return false
}

// withName returns a copy of a rate_limit mapping with name set, unless the
// user named it or it is unlimited.
func withName(lim *yaml.Node, name string) *yaml.Node {
	if lim.Kind != yaml.MappingNode || hasKey(lim, "name") || isUnlimited(lim) {
		return lim
	}
	c := *lim
	c.Content = append(append([]*yaml.Node(nil), lim.Content...), scalar("name", lim.Line), scalar(name, lim.Line))
	return &c
}

// withDefaultName names the rate_limit of a descriptor mapping.
func (p *parser) withDefaultName(desc *yaml.Node, name string) *yaml.Node {
	c := *desc
	c.Content = append([]*yaml.Node(nil), desc.Content...)
	for i := 0; i+1 < len(c.Content); i += 2 {
		if c.Content[i].Value == "rate_limit" {
			c.Content[i+1] = withName(p.flat(c.Content[i+1]), name)
		}
	}
	return &c
}

// scalar is a string scalar node at line.
func scalar(s string, line int) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Line: line}
}

// boolNode is a true boolean scalar node at line.
func boolNode(line int) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true", Line: line}
}

// mapNode builds a mapping from key, value pairs; nil values are skipped.
func mapNode(line int, kv ...any) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: line}
	for i := 0; i+1 < len(kv); i += 2 {
		v, _ := kv[i+1].(*yaml.Node)
		if v == nil {
			continue
		}
		m.Content = append(m.Content, scalar(kv[i].(string), line), v)
	}
	return m
}

// seqIf builds a sequence of items, or nil when cond is false or no items.
func seqIf(cond bool, items ...*yaml.Node) *yaml.Node {
	if !cond || len(items) == 0 {
		return nil
	}
	line := items[0].Line
	return &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: items, Line: line}
}
