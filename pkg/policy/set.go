package policy

import (
	"slices"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Set is a compiled, immutable configuration snapshot: per domain a
// descriptor tree, every Rule, and the key options. Safe for concurrent
// use; a reload builds a new Set. The zero value and nil match nothing.
type Set struct {
	keys    KeyOptions
	domains map[string]*domainTree
	names   []string // sorted domain names
	rules   []*Rule  // config order
	hash    string
	// sourceHash is the hex SHA-256 of the loaded files' paths and bytes
	// (and the load options); see SourceHash.
	sourceHash string
	// algorithms, backend and noPenalty are LoadOptions.Algorithms,
	// Backend and NoPenalty (checked while compiling).
	algorithms []algo.Kind
	backend    string
	// durable is LoadOptions.Durable.
	durable   DurableOptions
	noPenalty bool
	// literal is LoadOptions.LiteralValues: values are compared as
	// strings, addresses included.
	literal bool
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// HasDomain reports whether the config defines domain.
func (s *Set) HasDomain(domain string) bool {
	if s == nil {
		return false
	}
	_, ok := s.domains[domain]
	return ok
}

// Domains returns the configured domains, sorted.
func (s *Set) Domains() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.names)
}

// Rules returns every rule in config order (files in load order, then
// depth-first declaration order). The Rules are shared and must not be
// modified.
func (s *Set) Rules() []*Rule {
	if s == nil {
		return nil
	}
	return slices.Clone(s.rules)
}

// Match resolves one request descriptor level by level, as
// docs/config.md ("Matching") describes: exact value, then CIDR prefix,
// then the first wildcard, then the value-less default. Unlike
// envoyproxy/ratelimit it compares keys exactly and matches patterns
// against the value alone, so that ("a_b", x) cannot match key "a".
// A trailing Reserve.Entry or ReleaseKey entry is matched as the rule's
// reserve or lease release, and Match returns the rule's variant
// (Rule.Base) when cgnat or reserve select one.
//
// ok is false when no rule applies (an unlimited rule matches). The Match
// may retain entries; callers must not modify them while using it.
func (s *Set) Match(domain string, entries []Entry) (Match, bool) {
	if s == nil || len(entries) == 0 {
		return Match{}, false
	}
	d := s.domains[domain]
	if d == nil {
		return Match{}, false
	}
	release := false
	if n := len(entries); n > 1 && entries[n-1].Key == ReleaseKey {
		entries, release = entries[:n-1], true
	}
	nd := d.walk(entries)
	critical := false
	if n := len(entries); d.reserve && (nd == nil || nd.rule == nil) && n > 1 {
		// A trailing entry that names the priority of a rule with
		// reserve is not a level of the tree.
		last := entries[n-1]
		if p := d.walk(entries[:n-1]); p != nil && p.rule != nil && p.rule.Reserve != nil && p.rule.Reserve.Entry == last.Key {
			nd, entries, critical = p, entries[:n-1], last.Value == p.rule.Reserve.Value
		}
	}
	if nd == nil || nd.rule == nil {
		return Match{}, false
	}
	r := nd.rule
	if release && !r.hasConcurrency() {
		return Match{}, false
	}
	m := Match{Rule: r, MetricKey: r.Path, Release: release, id: entries}
	if r.needsPath {
		m.MetricKey = r.metricKey(entries)
		m.id = r.identity(entries)
	}
	if r.normalize {
		m.id = r.keyedIdentity(m.id, r.needsPath && len(m.id) > 0 && &m.id[0] != &entries[0])
	}
	if r.raised != nil || r.reduced != nil {
		m.Rule = r.variant(entries[len(entries)-1].Value, critical)
	}
	return m, true
}

// walk follows entries down the tree: the node reached by the last
// entry, nil when some entry has no node.
func (d *domainTree) walk(entries []Entry) *node {
	lv := d.top
	var nd *node
	for _, e := range entries {
		if lv == nil {
			return nil
		}
		if nd = lv.find(e); nd == nil {
			return nil
		}
		lv = nd.level
	}
	return nd
}

func (r *Rule) hasConcurrency() bool {
	for i := range r.Limits {
		if r.Limits[i].Algorithm == algo.Concurrency {
			return true
		}
	}
	return false
}

// metricKey builds the reference's stat key (docs/metrics.md):
// detailed_metric on the rule: every level "key_value" with the request
// value (the pattern on share_threshold levels); else value_to_metric
// levels matched by default or wildcard show "key_<request value>" (the
// pattern with share_threshold); other levels show the config segment.
func (r *Rule) metricKey(entries []Entry) string {
	var b strings.Builder
	b.WriteString(r.Domain)
	for i, n := range r.nodes {
		b.WriteByte('.')
		e := entries[i]
		switch {
		case r.DetailedMetric:
			v := e.Value
			if n.share {
				v = n.value
			}
			b.WriteString(n.key)
			if v != "" {
				b.WriteByte('_')
				b.WriteString(v)
			}
		case n.valueToMetric && n.kind != valueExact:
			v := e.Value
			if n.share {
				v = n.value
			}
			b.WriteString(n.key)
			b.WriteByte('_')
			b.WriteString(v)
		default:
			b.WriteString(n.seg)
		}
	}
	return b.String()
}

// identity returns the counter identity: the request entries, with the
// wildcard pattern in place of the value on share_threshold levels.
func (r *Rule) identity(entries []Entry) []Entry {
	shared := false
	for _, n := range r.nodes {
		shared = shared || n.share
	}
	if !shared {
		return entries
	}
	id := slices.Clone(entries)
	for i, n := range r.nodes {
		if n.share {
			id[i].Value = n.value
		}
	}
	return id
}

// Override builds the Match for a request-supplied RateLimitOverride
// (Envoy RateLimitDescriptor.limit) of requestsPerUnit per unit, under the
// `override:` policy of the rule the entries match, else of the domain:
// allow replaces the rule's limits, deny ignores the override, lower_only
// adds it to them; a rate above override.max is clamped to max.
// docs/config.md ("Request overrides") has the rules. The override limit
// keeps the rule's strictest failure_mode, and its key never collides with
// a config rule's. An invalid unit gives a Match with a nil Rule.
func (s *Set) Override(domain string, entries []Entry, requestsPerUnit uint32, unit Unit) Match {
	if !unit.Valid() {
		return Match{}
	}
	var d *domainTree
	if s != nil {
		d = s.domains[domain]
	}
	rule := d.lookup(entries)
	pol := effectiveOverride(d, rule)
	if pol.mode == OverrideDeny {
		m, _ := s.Match(domain, entries) // Rule nil when no rule matches
		return m
	}
	if pol.maxSet && aboveMax(requestsPerUnit, unit, pol.maxRPU, pol.maxUnit) {
		requestsPerUnit, unit = pol.maxRPU, pol.maxUnit
	}
	fm := pol.failure
	if rule != nil && len(rule.Limits) > 0 {
		fm = strictestFailure(rule)
	}
	var path, pn strings.Builder
	path.WriteString(domain)
	pn.WriteString(domain)
	for _, e := range entries {
		path.WriteByte('.')
		path.WriteString(e.Key)
		pn.WriteByte('.')
		pn.WriteString(e.Key)
		if e.Value != "" {
			path.WriteByte('_')
			path.WriteString(e.Value)
		}
	}
	sp := Spec{
		Policy:          sfSafe(pn.String()) + "#override",
		Unit:            unit,
		RequestsPerUnit: requestsPerUnit,
		UnitMultiplier:  1,
		Algorithm:       algo.FixedWindow,
		FailureMode:     fm,
		Window:          unit.Duration(),
	}
	sp.Limit = algo.Limit{Kind: algo.FixedWindow, Rate: int64(requestsPerUnit), Period: sp.Window, Multiplier: 1}
	r := &Rule{
		Domain:   domain,
		Path:     path.String(),
		Limits:   []Spec{sp},
		override: true,
		keyPre:   [][]byte{overridePrefix(domain, &sp)},
	}
	id := entries
	if pol.mode == OverrideLowerOnly && rule != nil && len(rule.Limits) > 0 {
		// The configured limits keep their keys (the rule's counters,
		// shared with requests that send no override) and failure modes.
		r.Limits = append(slices.Clone(rule.Limits), sp)
		r.keyPre = append(slices.Clone(rule.keyPre), r.keyPre[0])
		id = rule.identity(entries)
	}
	return Match{Rule: r, MetricKey: overrideMetricKey(domain, entries), Override: true, id: id}
}

// overrideMetricKey is the stat key envoyproxy/ratelimit gives a request
// limit override: the domain and '.', then each entry as "key" or
// "key_value", preceded by '.' only once something was written after the
// domain's. So no entries give "domain." and a leading entry with an
// empty key and value vanishes ("domain.k_v"). Only reference mode
// accepts such entries; for others this is Rule.Path.
func overrideMetricKey(domain string, entries []Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	b.WriteByte('.')
	n := b.Len()
	for _, e := range entries {
		if b.Len() > n {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}
