package replay

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// configFiles reads every config file that holds a rule of set, in the
// order the rules name them.
func configFiles(set *policy.Set, so SuggestOptions) ([]policy.Source, error) {
	seen := map[string]bool{}
	var out []policy.Source
	for _, r := range set.Rules() {
		if r.File == "" || seen[r.File] {
			continue
		}
		seen[r.File] = true
		data, err := so.ReadFile(r.File)
		if err != nil {
			return nil, fmt.Errorf("replay --suggest: reading the config: %w", err)
		}
		out = append(out, policy.Source{Name: r.File, Data: data})
	}
	if len(out) == 0 {
		return nil, errors.New("replay --suggest: the config has no rule")
	}
	return out, nil
}

// limitChange is a new requests_per_unit (and burst, 0 = unchanged) for
// one limit of a rule.
type limitChange struct{ limit, burst int64 }

type rewritten struct {
	policy.Source
	changed bool
}

// rewrite returns files with the limits of changes applied and every
// counted rule marked shadow_mode: true; comment adds a comment with the
// previous limit to each changed rate_limit. Rules it cannot find in their
// file (built from plans, or from YAML merge keys) are listed in notes.
func rewrite(files []policy.Source, set *policy.Set, changes map[string]limitChange, comment bool) ([]rewritten, []string, error) {
	byFile := map[string][]*policy.Rule{}
	for _, r := range set.Rules() {
		if anyCounted(r) {
			byFile[r.File] = append(byFile[r.File], r)
		}
	}
	var out []rewritten
	var notes []string
	for _, f := range files {
		var doc yaml.Node
		if err := yaml.Unmarshal(f.Data, &doc); err != nil {
			return nil, nil, fmt.Errorf("replay --suggest: %s: %w", f.Name, err)
		}
		nodes := map[int]*yaml.Node{}
		collectMappings(&doc, nodes)
		changed := false
		for _, r := range byFile[f.Name] {
			m := nodes[r.Line]
			lims := ruleLimits(m)
			found := m != nil && len(lims) == len(r.Limits)
			for k := range r.Limits {
				ch, has := changes[classID(r.Domain, r.Path, k)]
				switch {
				case !has:
				case !found:
					notes = append(notes, fmt.Sprintf("%s: rule %s not found at line %d (plans or merge keys); set its limit by hand", f.Name, r.Path, r.Line))
				default:
					rl := lims[k].value
					setScalar(rl, "requests_per_unit", strconv.FormatInt(ch.limit, 10), yaml.Node{Tag: "!!int"})
					if ch.burst > 0 {
						setScalar(rl, "burst", strconv.FormatInt(ch.burst, 10), yaml.Node{Tag: "!!int"})
					}
					if comment {
						c := "suggested by ratelimitd replay --suggest (was " + describeSpec(r.Limits[k]) + ")"
						if lims[k].key != nil {
							lims[k].key.HeadComment = c
						} else {
							mapValue(rl, "requests_per_unit").LineComment = c
						}
					}
				}
			}
			if found {
				setScalar(m, "shadow_mode", "true", yaml.Node{Tag: "!!bool"})
				changed = true
			}
		}
		data := f.Data
		if changed {
			var buf bytes.Buffer
			enc := yaml.NewEncoder(&buf)
			enc.SetIndent(2)
			if err := enc.Encode(&doc); err != nil {
				return nil, nil, err
			}
			_ = enc.Close()
			data = buf.Bytes()
		}
		out = append(out, rewritten{Source: policy.Source{Name: f.Name, Data: data}, changed: changed})
	}
	return out, notes, nil
}

// limitNode is one limit of a rule in its file: the rate_limit key (nil
// for an item of rate_limits) and the limit's mapping.
type limitNode struct{ key, value *yaml.Node }

// ruleLimits returns the limit mappings of the rule mapping m: rate_limit,
// or each item of rate_limits (in config order).
func ruleLimits(m *yaml.Node) []limitNode {
	if rl := mapValue(m, "rate_limit"); rl != nil {
		if rl.Kind != yaml.MappingNode {
			return nil
		}
		return []limitNode{{mapKey(m, "rate_limit"), rl}}
	}
	rls := mapValue(m, "rate_limits")
	if rls == nil || rls.Kind != yaml.SequenceNode {
		return nil
	}
	var out []limitNode
	for _, rl := range rls.Content {
		if rl.Kind != yaml.MappingNode {
			return nil
		}
		out = append(out, limitNode{nil, rl})
	}
	return out
}

// collectMappings indexes every mapping node that has a "key" by line.
func collectMappings(n *yaml.Node, out map[int]*yaml.Node) {
	if n.Kind == yaml.MappingNode && mapValue(n, "key") != nil {
		if _, dup := out[n.Line]; !dup {
			out[n.Line] = n
		}
	}
	for _, c := range n.Content {
		collectMappings(c, out)
	}
}

func mapKey(m *yaml.Node, k string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == k {
			return m.Content[i]
		}
	}
	return nil
}

func mapValue(m *yaml.Node, k string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == k {
			return m.Content[i+1]
		}
	}
	return nil
}

// setScalar sets m[k] = v, appending the pair when absent.
func setScalar(m *yaml.Node, k, v string, tmpl yaml.Node) {
	if n := mapValue(m, k); n != nil {
		n.Kind, n.Tag, n.Value, n.Style = yaml.ScalarNode, tmpl.Tag, v, 0
		n.Content = nil
		return
	}
	m.Content = append(m.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: tmpl.Tag, Value: v})
}
