package service

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// observePenalties counts the penalty boxes (policy.Rule.Penalty) this
// request started in ratelimitd_penalties_total and its hits a block
// denied in ratelimitd_penalty_denied_total, by domain and rule. A
// started block is logged, sampled (one line per rule per second), with
// the key as a hash of its backend key.
func (s *Service) observePenalties(domain string, ds []descState, hits []algo.Hit, decs []algo.Decision, outs []outcome) {
	for i := range ds {
		st := &ds[i]
		if st.match.Rule == nil || !st.match.Rule.Penalty.On() {
			continue
		}
		for _, a := range st.applied {
			if o := outs[a.hit]; o != byStore && o != byFallback {
				continue
			}
			d := decs[a.hit]
			rule := st.match.Rule.Path
			switch d.Penalty {
			case algo.PenaltyStarted:
				s.m.penalties.WithLabelValues(domain, rule).Inc()
				if ok, n := s.errLog.Allow("penalty\x00"+domain+"\x00"+rule, s.opts.Now()); ok {
					sum := sha256.Sum256([]byte(hits[a.hit].Key))
					s.opts.Logger.Warn("penalty: a key was denied penalty.after times within penalty.within and is blocked",
						"domain", domain, "rule", rule, "key_hash", hex.EncodeToString(sum[:8]),
						"block", st.match.Rule.Penalty.Block, "suppressed", n)
				}
			case algo.PenaltyBlocked:
				s.m.penaltyDenied.WithLabelValues(domain, rule).Inc()
			}
		}
	}
}
