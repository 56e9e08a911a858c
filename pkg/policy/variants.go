package policy

import (
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Reserve is a rule's `reserve:` option: requests whose descriptor ends
// with the entry Entry=Value (critical requests) are decided against the
// rule's limits; the others against Share of them (floor(Share ×
// requests_per_unit)), on the same counters (Rule.Reduced), so that the
// last 1-Share of every limit is kept for critical requests.
type Reserve struct {
	// Entry is the key of the trailing request entry that carries the
	// priority.
	Entry string
	// Value is the priority value of critical requests.
	Value string
	// Share is the part of each limit that other requests may use, in
	// (0, 1).
	Share float64
	// SaturatedShare is the lower share other requests may use while the
	// rule is marked saturated (adaptive mode; service admin API), in
	// (0, Share); 0 when not set.
	SaturatedShare float64
	// Line is the line of the `reserve:` key.
	Line int
}

// reserve parses `reserve: {entry: priority, value: critical, share: 0.8}`;
// all three are required.
func (p *parser) reserve(kn, v *yaml.Node) *Reserve {
	if v.Kind != yaml.MappingNode {
		p.errs.add(p.file, v.Line, "reserve must be a mapping {entry: priority, value: critical, share: 0.8}, got %s", kindName(v))
		return nil
	}
	r := &Reserve{Line: kn.Line}
	// ok is false once a field was reported; bad records which ones, so
	// that a field given but invalid is not reported again as missing.
	ok, shareSet := true, false
	bad := map[string]bool{}
	p.mapping(v, func(k string, kn, v *yaml.Node) {
		switch k {
		case "entry", "value":
			s, good := p.str(v, "reserve "+k)
			if !good {
				ok, bad[k] = false, true
			}
			if k == "entry" {
				r.Entry = s
			} else {
				r.Value = s
			}
		case "share", "saturated_share":
			f, err := strconv.ParseFloat(v.Value, 64)
			if v.Kind != yaml.ScalarNode || (v.Tag != "!!float" && v.Tag != "!!int") || err != nil || !(f > 0 && f < 1) {
				p.errs.add(p.file, v.Line, "reserve %s must be a number between 0 and 1 (exclusive), got %s", k, kindName(v))
				ok, bad[k] = false, true
				return
			}
			if k == "share" {
				shareSet, r.Share = true, f
			} else {
				r.SaturatedShare = f
			}
		default:
			p.unknown(kn, k, "reserve", nil, reserveKeys)
		}
	})
	var missing []string
	if r.Entry == "" && !bad["entry"] {
		missing = append(missing, "entry")
	}
	if r.Value == "" && !bad["value"] {
		missing = append(missing, "value")
	}
	if !shareSet && !bad["share"] {
		missing = append(missing, "share")
	}
	if len(missing) > 0 {
		p.errs.add(p.file, kn.Line, "reserve needs entry, value and share (e.g. {entry: priority, value: critical, share: 0.8}; missing: %s)", strings.Join(missing, ", "))
		return nil
	}
	if r.Entry == ReleaseKey {
		p.errs.add(p.file, kn.Line, "reserve entry %q is reserved for concurrency lease releases", ReleaseKey)
		return nil
	}
	if !ok {
		return nil
	}
	if r.SaturatedShare != 0 && r.SaturatedShare >= r.Share {
		p.errs.add(p.file, kn.Line, "reserve saturated_share %g must be below share %g", r.SaturatedShare, r.Share)
		return nil
	}
	return r
}

// buildVariants compiles the variants of rule r (node n) that cgnat and
// reserve select: a raised one, a reduced one, and the raised one
// reduced.
func (s *Set) buildVariants(r *Rule, n *node, errs *errList) {
	if r.Unlimited || len(r.Limits) == 0 {
		return
	}
	if c := r.CGNAT; c != nil && len(c.Ranges) > 0 {
		v := variantOf(r)
		v.Raised = true
		for i := range v.Limits {
			sp := &v.Limits[i]
			rpu := uint64(sp.RequestsPerUnit) * uint64(c.Multiplier)
			if rpu > uint64(^uint32(0)) {
				errs.add(n.file, c.Line, "cgnat: requests_per_unit %d × multiplier %d overflows", sp.RequestsPerUnit, c.Multiplier)
				return
			}
			sp.RequestsPerUnit = uint32(rpu)
			sp.Limit.Rate *= int64(c.Multiplier)
			if sp.Limit.Burst > 0 {
				sp.Limit.Burst *= int64(c.Multiplier)
				sp.Burst = sp.Limit.Burst
			}
			if err := sp.Limit.Validate(); err != nil {
				errs.add(n.file, c.Line, "cgnat: the raised limit of %q is invalid: %v", r.Path, err)
				return
			}
			var tmp [10]byte
			v.keyPre[i] = appendNS(appendNS(v.keyPre[i], "cgnat"), string(strconv.AppendUint(tmp[:0], uint64(c.Multiplier), 10)))
		}
		r.raised = v
	}
	if rs := r.Reserve; rs != nil {
		for _, sp := range r.Limits {
			if sp.Algorithm == algo.TokenBucket {
				errs.add(n.file, rs.Line, "reserve applies to fixed_window, sliding_window, sliding_log and concurrency limits; %q has a token_bucket limit", r.Path)
				return
			}
		}
		for _, c := range n.children {
			if c.key == rs.Entry {
				errs.add(n.file, rs.Line, "reserve entry %q is also the key of a child descriptor (line %d); requests would match the child", rs.Entry, c.line)
				return
			}
		}
		r.reduced = reducedOf(r, rs.Share)
		for i, sp := range r.reduced.Limits {
			if sp.Limit.Rate == 0 {
				errs.warn(n.file, rs.Line, "reserve share %g of %q's limit of %d gives other requests a limit of 0: only critical requests are ever admitted; raise share to at least %g or the limit", rs.Share, r.Path, r.Limits[i].Limit.Rate, 1/float64(r.Limits[i].Limit.Rate))
			}
		}
		if r.raised != nil {
			r.raised.reduced = reducedOf(r.raised, rs.Share)
		}
		if rs.SaturatedShare > 0 {
			r.reduced.saturated = reducedOf(r, rs.SaturatedShare)
			r.reduced.saturated.Saturated = true
			if r.raised != nil {
				r.raised.reduced.saturated = reducedOf(r.raised, rs.SaturatedShare)
				r.raised.reduced.saturated.Saturated = true
			}
		}
	}
}

// variantOf copies r as a variant with its own Limits and key prefixes.
func variantOf(r *Rule) *Rule {
	v := *r
	v.Base = r
	v.Limits = slices.Clone(r.Limits)
	v.keyPre = make([][]byte, len(r.keyPre))
	for i, k := range r.keyPre {
		v.keyPre[i] = slices.Clip(slices.Clone(k))
	}
	v.raised, v.reduced, v.saturated = nil, nil, nil
	return &v
}

// reducedOf is the reserve variant of r: every limit at floor(share ×
// requests_per_unit), on r's keys.
func reducedOf(r *Rule, share float64) *Rule {
	v := variantOf(r)
	if r.Base != nil {
		v.Base = r.Base
	}
	v.Reduced = true
	v.keyPre = r.keyPre
	for i := range v.Limits {
		sp := &v.Limits[i]
		sp.Limit.Rate = reducedRate(sp.Limit.Rate, share)
		sp.RequestsPerUnit = uint32(sp.Limit.Rate)
	}
	return v
}

// reducedRate is floor(share × rate), computed so that a share written
// in decimal (0.8 × 10) is not floored below its exact product by
// binary rounding.
func reducedRate(rate int64, share float64) int64 {
	x := share * float64(rate)
	f := int64(x)
	if float64(f+1)-x < 1e-9 {
		f++
	}
	return f
}

// Variants returns the variants of r that Match may return, and their
// SaturatedVariants (see Rule.Base), nil when it has none.
func (r *Rule) Variants() []*Rule {
	var out []*Rule
	add := func(v *Rule) {
		if v != nil {
			out = append(out, v)
			if v.saturated != nil {
				out = append(out, v.saturated)
			}
		}
	}
	add(r.reduced)
	if r.raised != nil {
		add(r.raised)
		add(r.raised.reduced)
	}
	return out
}

// SaturatedVariant returns the variant that replaces r, a Reduced
// variant, while its rule is marked saturated: the limits at
// Reserve.SaturatedShare, on the same counters. nil when r is not Reduced
// or the reserve has no saturated_share.
func (r *Rule) SaturatedVariant() *Rule { return r.saturated }

// variant selects the rule that decides a request matched to r: the
// raised variant when the value of r's own entry (last) is inside a
// cgnat range, then the reduced one unless the request is critical.
func (r *Rule) variant(last string, critical bool) *Rule {
	if r.raised != nil && r.CGNAT.contains(last) {
		r = r.raised
	}
	if r.reduced != nil && !critical {
		r = r.reduced
	}
	return r
}

// keyedIdentity rewrites the identity values of the levels with
// ipv6_prefix to their keyed address, and those of the other address
// levels (node.canon) to their canonical form; id is copied before the
// first change unless copied (it may be the request's entries).
func (r *Rule) keyedIdentity(id []Entry, copied bool) []Entry {
	for i, n := range r.nodes {
		if n.share || i >= len(id) {
			continue
		}
		v := id[i].Value
		switch {
		case n.ipv6Prefix > 0:
			v = keyedAddress(v, n.ipv6Prefix)
		case n.canon:
			v = canonAddrValue(v)
		}
		if v == id[i].Value {
			continue
		}
		if !copied {
			id, copied = slices.Clone(id), true
		}
		id[i].Value = v
	}
	return id
}
