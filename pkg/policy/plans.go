package policy

// The plans form: plan tiers keyed by a credential, per-route cost
// classes, a per-IP layer for anonymous traffic and exemptions, written as
// a few lines of config and expanded into the ordinary descriptor tree at
// parse time. Everything after expansion is the same code as for
// hand-written descriptors, and every generated node keeps the line of the
// plans entry it came from, so errors point at what the user wrote.
// docs/plans.md shows the expansion.

import (
	"sort"
	"strconv"

	"gopkg.in/yaml.v3"
)

var plansHints = map[string]string{
	"plan": "plan_key", "credential": "credential_key", "key": "plan_key or credential_key",
	"plans": "tiers", "tier": "tiers", "route": "routes", "exemptions": "exempt", "anon": "anonymous",
}

// plansSpec is a `plans:` mapping as written, before expansion.
type plansSpec struct {
	planKey, credKey, routeKey string
	tiers, routes, exempt      *yaml.Node
	anon                       *yaml.Node
	routeKeyLine               int
}

// planRoute is one route class of plans.routes.
type planRoute struct {
	name     string
	line     int
	limit    *yaml.Node            // default rate_limit for every tier
	perTier  map[string]*yaml.Node // tier overrides
	tierLine map[string]int
}

// planExemption is one plans.exempt entry.
type planExemption struct {
	credential string
	line       int
}

// plans expands a `plans:` mapping into a descriptors sequence node.
func (p *parser) plans(v *yaml.Node) *yaml.Node {
	out := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: v.Line, Column: v.Column}
	if v.Kind != yaml.MappingNode {
		p.errs.add(p.file, v.Line, "plans must be a mapping, got %s", kindName(v))
		return out
	}
	ps := p.plansFields(v)
	if ps.tiers == nil || ps.tiers.Kind != yaml.MappingNode || len(ps.tiers.Content) == 0 {
		p.errs.add(p.file, v.Line, "plans: tiers must be a non-empty mapping of plan name to rate_limit")
		return out
	}
	if ps.routes != nil && ps.routeKey == "" {
		p.errs.add(p.file, ps.routes.Line, "plans: routes need route_key (the descriptor entry that names the route class)")
	}
	if ps.routeKey != "" && ps.routes == nil {
		p.errs.add(p.file, ps.routeKeyLine, "plans: route_key without routes")
	}
	var rts []planRoute
	if ps.routes != nil && ps.routeKey != "" {
		rts = p.planRoutes(ps.routes)
	}
	var exs []planExemption
	if ps.exempt != nil {
		exs = p.planExemptions(ps.exempt)
	}

	tierNames := map[string]bool{}
	unlimitedTier := map[string]bool{}
	tierKV := p.pairs(ps.tiers)
	for i := 0; i+1 < len(tierKV); i += 2 {
		kn, val := tierKV[i], p.flat(tierKV[i+1])
		if kn.Kind != yaml.ScalarNode || kn.Tag != "!!str" || kn.Value == "" {
			p.errs.add(p.file, kn.Line, "plans: tier names must be non-empty strings")
			continue
		}
		tier := kn.Value
		tierNames[tier] = true
		if val.Kind != yaml.MappingNode {
			p.errs.add(p.file, val.Line, "plans: tier %q must be a rate_limit mapping, got %s", tier, kindName(val))
			continue
		}
		unlimitedTier[tier] = isUnlimited(val)
		out.Content = append(out.Content, ps.tierNode(kn, val, rts, exs))
	}
	for _, r := range rts {
		p.checkRouteTiers(r, tierNames, unlimitedTier)
	}
	if anon := ps.anon; anon != nil {
		if anon.Kind != yaml.MappingNode {
			p.errs.add(p.file, anon.Line, "plans: anonymous must be a descriptor mapping (key, rate_limit), got %s", kindName(anon))
		} else {
			anon = p.flat(anon)
			if !hasKey(anon, "rate_limit") && !hasKey(anon, "rate_limits") {
				p.errs.add(p.file, anon.Line, "plans: anonymous needs a rate_limit (without one it limits nothing)")
			}
			out.Content = append(out.Content, p.withDefaultName(anon, "anonymous"))
		}
	}
	return out
}

// plansFields reads the keys of a `plans:` mapping, reporting unknown ones
// and a missing plan_key or credential_key. A missing key is replaced by a
// placeholder, so that the expansion still runs (and checks the tier and
// route limits) with the error above the only one reported for it (not
// "descriptor has empty key" on every tier line).
func (p *parser) plansFields(v *yaml.Node) plansSpec {
	var ps plansSpec
	p.mapping(v, func(k string, kn, val *yaml.Node) {
		switch k {
		case "plan_key":
			ps.planKey, _ = p.str(val, k)
		case "credential_key":
			ps.credKey, _ = p.str(val, k)
		case "route_key":
			ps.routeKey, _ = p.str(val, k)
			ps.routeKeyLine = kn.Line
		case "tiers":
			ps.tiers = val
		case "routes":
			ps.routes = val
		case "exempt":
			ps.exempt = val
		case "anonymous":
			ps.anon = val
		default:
			p.unknown(kn, k, "plans", plansHints, plansKeys)
		}
	})
	if ps.planKey == "" {
		p.errs.add(p.file, v.Line, "plans: plan_key is required (the descriptor entry that names the plan)")
	}
	if ps.credKey == "" {
		p.errs.add(p.file, v.Line, "plans: credential_key is required (the descriptor entry that keys the counters)")
	}
	if ps.planKey == "" {
		ps.planKey = "<plan_key>"
	}
	if ps.credKey == "" {
		ps.credKey = "<credential_key>"
	}
	return ps
}

// planRoutes parses plans.routes: per route class a rate_limit, or a
// mapping of rate_limit (the default) and tiers (per-tier overrides).
func (p *parser) planRoutes(routes *yaml.Node) []planRoute {
	if routes.Kind != yaml.MappingNode {
		p.errs.add(p.file, routes.Line, "plans: routes must be a mapping of route class to rate_limit, got %s", kindName(routes))
		return nil
	}
	var rts []planRoute
	p.mapping(routes, func(name string, kn, val *yaml.Node) {
		r := planRoute{name: name, line: kn.Line, perTier: map[string]*yaml.Node{}, tierLine: map[string]int{}}
		val = p.flat(val)
		if val.Kind != yaml.MappingNode {
			p.errs.add(p.file, val.Line, "plans: route %q must be a rate_limit mapping, got %s", name, kindName(val))
			return
		}
		if !hasKey(val, "rate_limit") && !hasKey(val, "tiers") {
			r.limit = val // flattened above
			rts = append(rts, r)
			return
		}
		p.mapping(val, func(k string, kn2, v2 *yaml.Node) {
			switch k {
			case "rate_limit":
				r.limit = p.flat(v2)
			case "tiers":
				if v2.Kind != yaml.MappingNode {
					p.errs.add(p.file, v2.Line, "plans: route %q tiers must be a mapping of plan name to rate_limit", name)
					return
				}
				p.mapping(v2, func(tier string, kn3, v3 *yaml.Node) {
					r.perTier[tier] = p.flat(v3)
					r.tierLine[tier] = kn3.Line
				})
			default:
				p.unknown(kn2, k, "plans route "+strconv.Quote(name)+" (rate_limit, tiers)", nil, routeKeys)
			}
		})
		rts = append(rts, r)
	})
	return rts
}

// planExemptions parses plans.exempt: a list of {credential, reason},
// both required and non-empty.
func (p *parser) planExemptions(exempt *yaml.Node) []planExemption {
	if exempt.Kind != yaml.SequenceNode {
		p.errs.add(p.file, exempt.Line, "plans: exempt must be a list of {credential, reason}, got %s", kindName(exempt))
		return nil
	}
	var exs []planExemption
	for _, it := range exempt.Content {
		it = deref(it)
		if it.Kind != yaml.MappingNode {
			p.errs.add(p.file, it.Line, "plans: exempt: list of type other than map: item is %s", kindName(it))
			continue
		}
		var e planExemption
		var reason string
		p.mapping(it, func(k string, kn, val *yaml.Node) {
			switch k {
			case "credential":
				e.credential, _ = p.str(val, "credential")
				e.line = kn.Line
			case "reason":
				reason, _ = p.str(val, "reason")
			default:
				p.unknown(kn, k, "plans exempt entry (credential, reason)", nil, exemptKeys)
			}
		})
		switch {
		case e.credential == "":
			p.errs.add(p.file, it.Line, "plans: exempt entry needs a non-empty credential (exemptions are by credential, never by IP range)")
		case reason == "":
			p.errs.add(p.file, it.Line, "plans: exempt entry %q needs a reason (exemptions must be explained)", e.credential)
		default:
			exs = append(exs, e)
		}
	}
	return exs
}

// tierNode is the descriptor of one plan tier (key node kn, rate_limit
// val): plan_key=tier, holding first the exemptions (exact credentials,
// unlimited), then the credential's default with the tier limit and the
// tier's route limits below it.
func (ps *plansSpec) tierNode(kn, val *yaml.Node, rts []planRoute, exs []planExemption) *yaml.Node {
	tier := kn.Value
	unlimited := isUnlimited(val)
	var credChildren []*yaml.Node
	for _, e := range exs {
		credChildren = append(credChildren, mapNode(e.line,
			"key", scalar(ps.credKey, e.line),
			"value", scalar(e.credential, e.line),
			"rate_limit", mapNode(e.line, "unlimited", boolNode(e.line)),
			"descriptors", seqIf(ps.routeKey != "" && len(rts) > 0, mapNode(e.line,
				"key", scalar(ps.routeKey, e.line),
				"rate_limit", mapNode(e.line, "unlimited", boolNode(e.line))))))
	}
	var routeNodes []*yaml.Node
	for _, r := range rts {
		lim, line := r.limit, r.line
		if o, ok := r.perTier[tier]; ok {
			lim, line = o, r.tierLine[tier]
		}
		if unlimited {
			lim = mapNode(line, "unlimited", boolNode(line))
		}
		if lim == nil {
			continue // route limited only for some tiers
		}
		routeNodes = append(routeNodes, mapNode(line,
			"key", scalar(ps.routeKey, line),
			"value", scalar(r.name, line),
			"rate_limit", withName(lim, tier+"/"+r.name)))
	}
	credChildren = append(credChildren, mapNode(kn.Line,
		"key", scalar(ps.credKey, kn.Line),
		"rate_limit", withName(val, tier),
		"descriptors", seqIf(len(routeNodes) > 0, routeNodes...)))
	return mapNode(kn.Line,
		"key", scalar(ps.planKey, kn.Line),
		"value", scalar(tier, kn.Line),
		"descriptors", seqIf(true, credChildren...))
}

// checkRouteTiers reports the tier overrides of route r that name an
// unknown tier or an unlimited one, in tier name order.
func (p *parser) checkRouteTiers(r planRoute, tierNames, unlimitedTier map[string]bool) {
	var unknownTiers []string
	for t := range r.perTier {
		if !tierNames[t] {
			unknownTiers = append(unknownTiers, t)
		}
	}
	sort.Strings(unknownTiers)
	for _, t := range unknownTiers {
		p.errs.add(p.file, r.tierLine[t], "plans: route %q overrides unknown tier %q", r.name, t)
	}
	var unlimitedTiers []string
	for t := range r.perTier {
		if unlimitedTier[t] {
			unlimitedTiers = append(unlimitedTiers, t)
		}
	}
	sort.Strings(unlimitedTiers)
	for _, t := range unlimitedTiers {
		p.errs.add(p.file, r.tierLine[t], "plans: route %q overrides tier %q, which is unlimited (every route of an unlimited tier is unlimited); remove the override or give tier %q a limit", r.name, t, t)
	}
}
