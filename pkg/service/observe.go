package service

import (
	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// observeDecisions counts one decision per descriptor with an applied
// limit.
func (s *Service) observeDecisions(sn *snapshot, domain string, ds []descState, decs []algo.Decision, outs []outcome) {
	capper := s.detailed.Load()
	for i := range ds {
		st := &ds[i]
		if len(st.applied) == 0 {
			continue
		}
		rule := st.match.Rule.Path
		cached := sn.rules[st.match.Rule]
		switch {
		case st.override:
			rule, cached = LabelOverride, nil
		case st.match.Rule.DetailedMetric && s.opts.DetailedMetricCap > 0 && st.match.MetricKey != "":
			rule, cached = capper.label(validUTF8(st.match.MetricKey)), nil // request values: labels must be UTF-8
		}
		if cached != nil && st.match.Rule.Domain != domain {
			cached = nil // the cache is labelled with the rule's domain
		}
		result := idxOK
		closed, open, near := false, false, false
		for _, a := range st.applied {
			switch outs[a.hit] {
			case byFailedClosed:
				closed = true
			case byFailedOpen:
				open = true
			}
			if s.nearLimit(a.spec, decs[a.hit]) && outs[a.hit] != byFailedOpen {
				near = true
			}
		}
		switch {
		case st.denied && closed:
			result = idxFailedClosed
		case st.denied && st.shadow:
			result = idxShadow
		case st.denied:
			result = idxOverLimit
		case open:
			result = idxFailedOpen
		case near:
			result = idxNearLimit
		}
		s.obs.decided(sn, domain, st, rule, result, cached, decs, outs)
	}
}

// observeRefunds counts the is_negative_hits descriptors whose refund a
// store applied to at least one of their limits (not when the backend
// failed and the refund was only answered). domain is a config domain:
// only a matched descriptor has applied limits.
func (s *Service) observeRefunds(domain string, ds []descState, outs []outcome) {
	for i := range ds {
		st := &ds[i]
		if !st.refund || len(st.applied) == 0 {
			continue
		}
		for _, a := range st.applied {
			if o := outs[a.hit]; o == byStore || o == byFallback {
				s.m.refunds.WithLabelValues(domain).Inc()
				s.m.refundUnits.WithLabelValues(domain).Add(float64(st.cost))
				break
			}
		}
	}
}
