package service

import (
	"context"
	"log/slog"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// cgnatLogRate is the most cgnat decision log lines per second (the
// bucket holds one second's worth); the others are counted in the next
// line's "suppressed".
const cgnatLogRate = 1

// observeAddressPolicies counts the descriptors that cgnat raised
// (ratelimitd_cgnat_raised_total) and the non-critical ones a reserve
// share denied (ratelimitd_reserve_shed_total), and logs the cgnat
// decision, sampled by cgnatLog: msg "cgnat raised limit", attributes
// domain, rule, multiplier, key (the backend key of the first applied
// limit: hashed like every key, so no address reaches the log unless
// --key-values=clear) and suppressed.
func (s *Service) observeAddressPolicies(domain string, ds []descState, hits []algo.Hit, decs []algo.Decision, outs []outcome) {
	for i := range ds {
		st := &ds[i]
		if len(st.applied) == 0 || st.override {
			continue
		}
		r := st.match.Rule
		if r.Reduced && st.denied && !st.shadow && deniedByStore(st, decs, outs) {
			s.m.reserveShed.WithLabelValues(domain, r.Path).Inc()
		}
		if !r.Raised {
			continue
		}
		s.m.cgnatRaised.WithLabelValues(domain, r.Path).Inc()
		ok, suppressed := s.cgnatLog.take(s.opts.Now())
		if !ok {
			continue
		}
		s.opts.Logger.LogAttrs(context.Background(), slog.LevelInfo, "cgnat raised limit",
			slog.String("domain", domain),
			slog.String("rule", r.Path),
			slog.Int("multiplier", int(r.CGNAT.Multiplier)),
			slog.String("key", hits[st.applied[0].hit].Key),
			slog.Int64("suppressed", suppressed))
	}
}

// deniedByStore reports whether a limit of st was denied by a decision
// (the store's or the fallback's), not by a failure mode.
func deniedByStore(st *descState, decs []algo.Decision, outs []outcome) bool {
	for _, a := range st.applied {
		if !decs[a.hit].Allowed && (outs[a.hit] == byStore || outs[a.hit] == byFallback) {
			return true
		}
	}
	return false
}
