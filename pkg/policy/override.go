package policy

import (
	"math/bits"
	"strings"

	"gopkg.in/yaml.v3"
)

// OverrideMode is what a request limit override (Envoy
// RateLimitDescriptor.limit) may do on a rule or domain (the `override:
// {mode: ...}` config field, docs/config.md "Request overrides"). The zero
// value OverrideAllow is the reference's behaviour.
type OverrideMode uint8

const (
	// OverrideAllow: the override replaces the configured limits, at the
	// rate sent (capped by override.max when set).
	OverrideAllow OverrideMode = iota
	// OverrideDeny: the override is ignored; the configured rule applies as
	// if no override had been sent (none: the descriptor matches nothing).
	OverrideDeny
	// OverrideLowerOnly: the override is counted in addition to the
	// configured limits, so it can only lower what is admitted; with no
	// configured limit (no rule, or an unlimited one) it applies alone.
	OverrideLowerOnly
)

// String returns the config spelling of the mode: "allow", "deny" or
// "lower_only" (unknown values print as "allow").
func (m OverrideMode) String() string {
	switch m {
	case OverrideDeny:
		return "deny"
	case OverrideLowerOnly:
		return "lower_only"
	}
	return "allow"
}

// overridePolicy is a parsed `override:` mapping, of a descriptor (rule
// level) or a file's top level (domain level). Unset fields inherit: rule
// from domain, domain from the defaults (allow, no max, failure_mode open).
type overridePolicy struct {
	line    int
	file    string
	modeSet bool
	mode    OverrideMode
	maxSet  bool
	maxRPU  uint32
	maxUnit Unit
	failSet bool
	failure FailureMode
}

var overrideKeys = []string{"mode", "max", "failure_mode"}
var overrideMaxKeys = []string{"requests_per_unit", "unit"}

// overrideField parses an `override:` mapping at line kn.Line; domainLevel
// allows failure_mode (a rule's override inherits the rule's).
func (p *parser) overrideField(kn, v *yaml.Node, domainLevel bool) *overridePolicy {
	if v.Kind != yaml.MappingNode {
		p.errs.add(p.file, v.Line, "override must be a mapping with mode, max or failure_mode, got %s", kindName(v))
		return nil
	}
	before := len(p.errs.errs)
	op := &overridePolicy{line: kn.Line, file: p.file}
	var maxLine int
	p.mapping(v, func(k string, kn, v *yaml.Node) {
		switch k {
		case "mode":
			s, _ := p.str(v, "override mode")
			switch strings.ToLower(s) {
			case "allow":
				op.mode = OverrideAllow
			case "deny":
				op.mode = OverrideDeny
			case "lower_only":
				op.mode = OverrideLowerOnly
			default:
				p.errs.add(p.file, v.Line, "invalid override mode %q: want allow, deny or lower_only", s)
				return
			}
			op.modeSet = true
		case "max":
			maxLine = kn.Line
			if v.Kind != yaml.MappingNode {
				p.errs.add(p.file, v.Line, "override max must be a mapping with requests_per_unit and unit, got %s", kindName(v))
				return
			}
			var rpuSet, unitSet bool
			inner := len(p.errs.errs)
			p.mapping(v, func(k string, kn, v *yaml.Node) {
				switch k {
				case "requests_per_unit":
					if n, ok := p.integer(v, "override max requests_per_unit", 0, MaxRequestsPerUnit); ok {
						op.maxRPU, rpuSet = uint32(n), true
					}
				case "unit":
					s, _ := p.str(v, "override max unit")
					u, ok := ParseUnit(s)
					if !ok {
						p.errs.add(p.file, v.Line, "invalid override max unit %q: want second, minute, hour, day, week, month or year", s)
						return
					}
					op.maxUnit, unitSet = u, true
				default:
					p.unknown(kn, k, "override max", nil, overrideMaxKeys)
				}
			})
			if len(p.errs.errs) > inner {
				return
			}
			if !rpuSet || !unitSet {
				p.errs.add(p.file, kn.Line, "override max needs requests_per_unit and unit")
				return
			}
			op.maxSet = true
		case "failure_mode":
			if !domainLevel {
				p.errs.add(p.file, kn.Line, "override failure_mode is only allowed at the top level of the file: an override of a rule always has the rule's failure_mode")
				return
			}
			if f, ok := p.failureMode(v, "override failure_mode"); ok {
				op.failure, op.failSet = f, true
			}
		default:
			p.unknown(kn, k, "override", nil, overrideKeys)
		}
	})
	if op.maxSet && op.modeSet && op.mode == OverrideDeny {
		p.errs.add(p.file, maxLine, "override max has no effect with mode deny (overrides are ignored)")
	}
	if len(p.errs.errs) > before {
		return nil
	}
	return op
}

// effectiveOverride resolves the policy for an override of rule r (nil:
// no rule) in domain d: rule-level fields, else domain-level, else the
// defaults.
func effectiveOverride(d *domainTree, r *Rule) overridePolicy {
	var out overridePolicy
	var dom, rl *overridePolicy
	if d != nil {
		dom = d.override
	}
	if r != nil && len(r.nodes) > 0 {
		rl = r.nodes[len(r.nodes)-1].override
	}
	for _, op := range []*overridePolicy{dom, rl} {
		if op == nil {
			continue
		}
		if op.modeSet {
			out.mode, out.modeSet = op.mode, true
		}
		if op.maxSet {
			out.maxRPU, out.maxUnit, out.maxSet = op.maxRPU, op.maxUnit, true
		}
	}
	if dom != nil && dom.failSet {
		out.failure, out.failSet = dom.failure, true
	}
	return out
}

// aboveMax reports whether rpu per unit exceeds the cap maxRPU per
// maxUnit: more requests in one window than the cap allows, or a higher
// average rate (rpu/unit > maxRPU/maxUnit, compared exactly in 128 bits).
func aboveMax(rpu uint32, unit Unit, maxRPU uint32, maxUnit Unit) bool {
	if rpu > maxRPU {
		return true
	}
	hi1, lo1 := bits.Mul64(uint64(rpu), uint64(maxUnit.Duration()))
	hi2, lo2 := bits.Mul64(uint64(maxRPU), uint64(unit.Duration()))
	return hi1 > hi2 || (hi1 == hi2 && lo1 > lo2)
}

// strictestFailure is the strictest failure mode of r's limits: closed,
// else local, else open (FailOpen for a rule without limits).
func strictestFailure(r *Rule) FailureMode {
	f := FailOpen
	for i := range r.Limits {
		switch r.Limits[i].FailureMode {
		case FailClosed:
			return FailClosed
		case FailLocal:
			f = FailLocal
		}
	}
	return f
}

// lookup returns the rule of the node that entries reach in d, exactly as
// Match resolves a descriptor (without lease releases), or nil.
func (d *domainTree) lookup(entries []Entry) *Rule {
	if d == nil || len(entries) == 0 {
		return nil
	}
	if nd := d.walk(entries); nd != nil {
		return nd.rule
	}
	return nil
}
