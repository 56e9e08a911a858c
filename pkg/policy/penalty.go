package policy

import (
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// maxPenaltySpan bounds penalty within and block: a year.
const maxPenaltySpan = 365 * 24 * time.Hour

// penalty parses `penalty: {after: 3, within: 1h, block: 5m, extend:
// false}` (after, within and block required; durations in Go's syntax).
func (p *parser) penalty(kn, v *yaml.Node) *penaltyOption {
	if v.Kind != yaml.MappingNode {
		p.errs.add(p.file, v.Line, "penalty must be a mapping {after: 3, within: 1h, block: 5m}, got %s", kindName(v))
		return nil
	}
	o := &penaltyOption{line: kn.Line}
	ok := true
	dur := func(v *yaml.Node, k string) time.Duration {
		d, err := time.ParseDuration(v.Value)
		if v.Kind != yaml.ScalarNode || v.Tag != "!!str" || err != nil || d <= 0 || d > maxPenaltySpan {
			p.errs.add(p.file, v.Line, "penalty %s must be a duration such as 30s, 5m or 1h, above 0 and at most 8760h, got %q", k, v.Value)
			ok = false
		}
		return d
	}
	p.mapping(v, func(k string, kn, v *yaml.Node) {
		switch k {
		case "after":
			n, good := p.integer(v, "penalty after", 1, 1_000_000)
			ok = ok && good
			o.p.After = n
		case "within":
			o.p.Within = dur(v, k)
		case "block":
			o.p.Block = dur(v, k)
		case "extend":
			o.p.Extend = p.boolean(v, "penalty extend")
		default:
			p.unknown(kn, k, "penalty", nil, penaltyKeys)
		}
	})
	if o.p.After == 0 && ok || o.p.Within == 0 && ok || o.p.Block == 0 && ok {
		p.errs.add(p.file, kn.Line, "penalty needs after, within and block (e.g. {after: 3, within: 1h, block: 5m})")
		return nil
	}
	if !ok {
		return nil
	}
	return o
}

// penaltyOption is a parsed `penalty:` and the line of its key.
type penaltyOption struct {
	p    algo.Penalty
	line int
}

var penaltyKeys = []string{"after", "within", "block", "extend"}
