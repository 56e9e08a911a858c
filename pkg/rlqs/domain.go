package rlqs

import (
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// maxLoggedDomain bounds the bytes of a client's domain in a log line.
const maxLoggedDomain = 64

// checkDomain logs and counts a stream whose domain (from its first
// report) is empty or not in set, as ShouldRateLimit counts an unknown
// domain: its buckets match no rule and are answered ALLOW_ALL, nothing
// charged. The line is rate limited (warn); the domain is cut
// to maxLoggedDomain bytes (the handler quotes or escapes it).
func (s *Server) checkDomain(st *stream, set *policy.Set) {
	if st.domain != "" && set.HasDomain(st.domain) {
		return
	}
	if s.opt.UnknownDomain != nil {
		s.opt.UnknownDomain()
	}
	d := st.domain
	if len(d) > maxLoggedDomain {
		d = d[:maxLoggedDomain]
	}
	s.warn("unknown_domain", "rlqs: stream of a domain not in the config; its buckets are answered ALLOW_ALL",
		"stream", st.id, "domain", d, "empty", st.domain == "")
}
