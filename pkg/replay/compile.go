package replay

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// compile checks every action is reproducible and precompiles regexes.
func (e *Envoy) compile() error {
	var errs []error
	checkLimits := func(where string, rls []*routev3.RateLimit) {
		for i, rl := range rls {
			for j, a := range rl.GetActions() {
				if err := e.compileAction(a); err != nil {
					errs = append(errs, fmt.Errorf("%s rate_limits[%d].actions[%d]: %w", where, i, j, err))
				}
			}
		}
	}
	for _, vh := range e.routes.GetVirtualHosts() {
		checkLimits("virtual host "+vh.GetName(), vh.GetRateLimits())
		for ri, r := range vh.GetRoutes() {
			where := fmt.Sprintf("virtual host %s route %d", vh.GetName(), ri)
			m := r.GetMatch()
			if re := m.GetSafeRegex(); re != nil {
				if err := e.addRegexp(re.GetRegex()); err != nil {
					errs = append(errs, fmt.Errorf("%s match: %w", where, err))
				}
			}
			if m.GetConnectMatcher() != nil || m.GetPathMatchPolicy() != nil {
				errs = append(errs, fmt.Errorf("%s match: connect_matcher and path_match_policy are not supported", where))
			}
			for _, h := range m.GetHeaders() {
				if err := e.compileHeader(h); err != nil {
					errs = append(errs, fmt.Errorf("%s match: %w", where, err))
				}
			}
			for _, q := range m.GetQueryParameters() {
				if err := e.compileString(q.GetStringMatch()); err != nil {
					errs = append(errs, fmt.Errorf("%s match: %w", where, err))
				}
			}
			if ra := r.GetRoute(); ra != nil {
				checkLimits(where, ra.GetRateLimits())
			}
		}
	}
	return errors.Join(errs...)
}

func (e *Envoy) addRegexp(re string) error {
	if _, ok := e.regexps[re]; ok {
		return nil
	}
	c, err := regexp.Compile(`^(?:` + re + `)$`)
	if err != nil {
		return fmt.Errorf("regex %q: %w", re, err)
	}
	e.regexps[re] = c
	return nil
}

func (e *Envoy) compileString(sm *matcherv3.StringMatcher) error {
	if sm == nil {
		return nil
	}
	if re := sm.GetSafeRegex(); re != nil {
		return e.addRegexp(re.GetRegex())
	}
	if sm.GetCustom() != nil {
		return errors.New("custom string matchers are not supported")
	}
	return nil
}

func (e *Envoy) compileHeader(h *routev3.HeaderMatcher) error {
	if h.GetRangeMatch() != nil {
		return errors.New("range_match header matchers are not supported")
	}
	if re := h.GetSafeRegexMatch(); re != nil { //nolint:staticcheck // deprecated fields still occur in deployed configs
		return e.addRegexp(re.GetRegex())
	}
	return e.compileString(h.GetStringMatch())
}

func (e *Envoy) compileAction(a *routev3.RateLimit_Action) error {
	switch s := a.GetActionSpecifier().(type) {
	case *routev3.RateLimit_Action_SourceCluster_, *routev3.RateLimit_Action_DestinationCluster_,
		*routev3.RateLimit_Action_RequestHeaders_, *routev3.RateLimit_Action_QueryParameters_,
		*routev3.RateLimit_Action_RemoteAddress_, *routev3.RateLimit_Action_MaskedRemoteAddress_:
		return nil
	case *routev3.RateLimit_Action_GenericKey_:
		if strings.Contains(s.GenericKey.GetDescriptorValue(), "%") {
			return errors.New("generic_key formatters (%...%) are not supported")
		}
		return nil
	case *routev3.RateLimit_Action_HeaderValueMatch_:
		for _, h := range s.HeaderValueMatch.GetHeaders() {
			if err := e.compileHeader(h); err != nil {
				return err
			}
		}
		return nil
	case *routev3.RateLimit_Action_QueryParameterValueMatch_:
		for _, q := range s.QueryParameterValueMatch.GetQueryParameters() {
			if err := e.compileString(q.GetStringMatch()); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("action %T cannot be replayed from an access log", s)
	}
}
