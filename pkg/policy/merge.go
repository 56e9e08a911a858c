package policy

import (
	"gopkg.in/yaml.v3"
)

// isMergeKey reports whether a mapping key is the YAML merge key: a plain
// `<<` (yaml.v3 tags it !!merge; a quoted "<<" is an ordinary string key).
func isMergeKey(kn *yaml.Node) bool {
	return kn.Kind == yaml.ScalarNode && kn.Tag == "!!merge"
}

// maxMergeDepth bounds nested merge keys (a merged mapping that itself
// merges), well above any hand-written config.
const maxMergeDepth = 32

// pairs returns the key and value nodes (dereferenced, alternating) of a
// mapping with merge keys expanded, following the YAML merge key type
// (yaml.org/type/merge.html) as yaml.v2 implements it: the value of `<<` is
// a mapping (or alias of one) or a list of them; an explicit key of the
// mapping overrides a merged one wherever the `<<` stands, and an earlier
// mapping of a merge list wins over a later one. Merged pairs are placed
// where the `<<` stands and keep their own nodes, so errors point at the
// line of the anchored mapping. Explicit duplicates are kept (mapping
// reports them); merged keys never count as duplicates. A merge value that
// is not a mapping, or a merge cycle, is reported.
func (p *parser) pairs(m *yaml.Node) []*yaml.Node {
	return p.pairsDepth(m, 0)
}

func (p *parser) pairsDepth(m *yaml.Node, depth int) []*yaml.Node {
	hasMerge := false
	for i := 0; i+1 < len(m.Content); i += 2 {
		if isMergeKey(deref(m.Content[i])) {
			hasMerge = true
			break
		}
	}
	if !hasMerge {
		out := make([]*yaml.Node, 0, len(m.Content))
		for _, n := range m.Content {
			out = append(out, deref(n))
		}
		return out
	}
	if p.merging == nil {
		p.merging = map[*yaml.Node]bool{}
	}
	p.merging[m] = true
	defer delete(p.merging, m)
	explicit := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if kn := deref(m.Content[i]); !isMergeKey(kn) && kn.Kind == yaml.ScalarNode {
			explicit[kn.Value] = true
		}
	}
	merged := map[string]bool{}
	var out []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, v := deref(m.Content[i]), deref(m.Content[i+1])
		if !isMergeKey(kn) {
			out = append(out, kn, v)
			continue
		}
		var srcs []*yaml.Node
		switch v.Kind {
		case yaml.MappingNode:
			srcs = []*yaml.Node{v}
		case yaml.SequenceNode:
			for _, it := range v.Content {
				if it = deref(it); it.Kind != yaml.MappingNode {
					p.errs.add(p.file, it.Line, "merge key << (line %d): list item must be a mapping or an alias of one, got %s", kn.Line, kindName(it))
					continue
				}
				srcs = append(srcs, it)
			}
		default:
			p.errs.add(p.file, v.Line, "merge key << must be a mapping, an alias of one or a list of them, got %s", kindName(v))
			continue
		}
		for _, src := range srcs {
			if p.merging[src] || depth >= maxMergeDepth {
				p.errs.add(p.file, kn.Line, "merge key << refers to a mapping that contains itself (or nests merges deeper than %d)", maxMergeDepth)
				continue
			}
			if !p.spend(src) {
				return out
			}
			sub := p.pairsDepth(src, depth+1)
			for j := 0; j+1 < len(sub); j += 2 {
				skn := sub[j]
				if skn.Kind == yaml.ScalarNode {
					if explicit[skn.Value] || merged[skn.Value] {
						continue
					}
					merged[skn.Value] = true
				}
				out = append(out, skn, sub[j+1])
			}
		}
	}
	return out
}

// flat returns a mapping node equal to m with its merge keys expanded (m
// itself when it has none), for code that inspects keys directly (plans).
func (p *parser) flat(m *yaml.Node) *yaml.Node {
	m = deref(m)
	if m == nil || m.Kind != yaml.MappingNode {
		return m
	}
	kv := p.pairs(m)
	same := len(kv) == len(m.Content)
	for i := range kv {
		if same && kv[i] != m.Content[i] {
			same = false
		}
	}
	if same {
		return m
	}
	c := *m
	c.Content = kv
	return &c
}
