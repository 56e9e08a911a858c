package replay

import (
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

func (e *Envoy) routeMatches(m *routev3.RouteMatch, r *Request) bool {
	caseSensitive := m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()
	eq := func(a, b string) bool {
		if caseSensitive {
			return a == b
		}
		return strings.EqualFold(a, b)
	}
	hasPrefix := func(s, p string) bool {
		return len(s) >= len(p) && eq(s[:len(p)], p)
	}
	path := r.pathNoQuery()
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		if !hasPrefix(r.Path, ps.Prefix) {
			return false
		}
	case *routev3.RouteMatch_Path:
		if !eq(path, ps.Path) {
			return false
		}
	case *routev3.RouteMatch_SafeRegex:
		if !e.regexps[ps.SafeRegex.GetRegex()].MatchString(path) {
			return false
		}
	case *routev3.RouteMatch_PathSeparatedPrefix:
		p := ps.PathSeparatedPrefix
		if !hasPrefix(path, p) || (len(path) > len(p) && path[len(p)] != '/') {
			return false
		}
	default:
		return false
	}
	for _, h := range m.GetHeaders() {
		if !e.headerMatches(h, r) {
			return false
		}
	}
	if qps := m.GetQueryParameters(); len(qps) > 0 {
		q := r.query()
		for _, qp := range qps {
			vs, ok := q[qp.GetName()]
			switch {
			case qp.GetPresentMatch():
				if !ok {
					return false
				}
			case qp.GetStringMatch() != nil:
				if !ok || !e.stringMatches(qp.GetStringMatch(), vs[0]) {
					return false
				}
			}
		}
	}
	return true
}

func (e *Envoy) stringMatches(sm *matcherv3.StringMatcher, v string) bool {
	ic := sm.GetIgnoreCase()
	fold := func(s string) string {
		if ic {
			return strings.ToLower(s)
		}
		return s
	}
	switch p := sm.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(v) == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		return e.regexps[p.SafeRegex.GetRegex()].MatchString(v)
	}
	return false
}

// headerMatches implements config.route.v3.HeaderMatcher on the headers a
// log records (plus :path and :method). The deprecated direct matchers
// (exact_match, prefix_match, ...) are still honoured, as by Envoy.
//
//nolint:staticcheck // deprecated fields still occur in deployed configs
func (e *Envoy) headerMatches(h *routev3.HeaderMatcher, r *Request) bool {
	v, ok := r.header(h.GetName())
	if !ok && h.GetTreatMissingHeaderAsEmpty() {
		v, ok = "", true
	}
	var m bool
	switch s := h.GetHeaderMatchSpecifier().(type) {
	case nil:
		m = ok
	case *routev3.HeaderMatcher_PresentMatch:
		m = ok == s.PresentMatch
	case *routev3.HeaderMatcher_ExactMatch:
		m = ok && v == s.ExactMatch
	case *routev3.HeaderMatcher_PrefixMatch:
		m = ok && strings.HasPrefix(v, s.PrefixMatch)
	case *routev3.HeaderMatcher_SuffixMatch:
		m = ok && strings.HasSuffix(v, s.SuffixMatch)
	case *routev3.HeaderMatcher_ContainsMatch:
		m = ok && strings.Contains(v, s.ContainsMatch)
	case *routev3.HeaderMatcher_SafeRegexMatch:
		m = ok && e.regexps[s.SafeRegexMatch.GetRegex()].MatchString(v)
	case *routev3.HeaderMatcher_StringMatch:
		m = ok && e.stringMatches(s.StringMatch, v)
	}
	if !ok {
		// Envoy: a missing header never matches, inverted or not (unless
		// present_match: false).
		if _, pm := h.GetHeaderMatchSpecifier().(*routev3.HeaderMatcher_PresentMatch); !pm {
			return false
		}
	}
	return m != h.GetInvertMatch()
}
