package service

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Response header names (lower case, as HTTP/2 sends them).
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"      // draft-ietf-httpapi-ratelimit-headers-10 §5
	HeaderRateLimit       = "RateLimit"             // draft-ietf-httpapi-ratelimit-headers-10 §6
	HeaderRetryAfter      = "Retry-After"           // RFC 9110 §10.2.3, delay-seconds
	HeaderContentType     = "Content-Type"          // application/problem+json on OVER_LIMIT
	HeaderLegacyLimit     = "X-RateLimit-Limit"     // requests_per_unit of the chosen limit (default LegacyHeaderNames.Limit)
	HeaderLegacyRemaining = "X-RateLimit-Remaining" // limit_remaining of the chosen limit (default LegacyHeaderNames.Remaining)
	HeaderLegacyReset     = "X-RateLimit-Reset"     // seconds until reset of the chosen limit (default LegacyHeaderNames.Reset)
	HeaderNearLimit       = "Ratelimitd-Near-Limit" // RFC 9651 list of policy names past the near-limit ratio
	ProblemContentType    = "application/problem+json"
)

// policyName is the Spec's policy name made safe for an RFC 9651 String
// (printable ASCII; other bytes become '_').
func policyName(st *descState, sp *policy.Spec) string { return specPolicyName(st.match.Rule, sp) }

// specPolicyName is policyName of a Spec of rule r.
func specPolicyName(r *policy.Rule, sp *policy.Spec) string {
	n := sp.Policy
	if n == "" {
		n = sp.Name
	}
	if n == "" {
		n = r.Path
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '_'
		}
		return r
	}, n)
}

// addHeaders fills response_headers_to_add and, when the request is
// denied (after global shadow mode) and Options.OmitProblem is not set,
// Retry-After, Content-Type and raw_body (problem.go).
func (s *Service) addHeaders(blk *responseBlock, ds []descState, decs []algo.Decision, outs []outcome, deny bool) {
	resp := &blk.resp
	// The header values are RFC 9651 Lists serialized directly (as
	// httpsfv.Marshal would; a header with an out-of-range Integer is
	// omitted as Marshal fails) into buffers on the stack, then into one
	// string.
	var polArr, limArr [256]byte
	policies, limits := polArr[:0], limArr[:0]
	nPolicies, nLimits := 0, 0
	policiesOK, limitsOK := true, true
	var nearArr [smallHits]*specInfo
	near := nearArr[:0]
	var legacy legacyPick
	var violated []applied
	var violatedDesc []int // index in ds of violated[i]
	for i := range ds {
		st := &ds[i]
		for _, a := range st.applied {
			d := decs[a.hit]
			if nPolicies > 0 {
				policies = append(policies, ", "...)
			}
			policies = append(policies, a.info.policyItem...)
			policiesOK = policiesOK && a.info.policyOK
			nPolicies++
			if outs[a.hit] == byFailedOpen {
				continue // state unknown: no RateLimit item, no legacy pick
			}
			if nLimits > 0 {
				limits = append(limits, ", "...)
			}
			var ok bool
			limits, ok = appendLimitItem(limits, a.info, d)
			limitsOK = limitsOK && ok
			nLimits++
			if s.nearLimit(a.spec, d) {
				near = append(near, a.info)
			}
			legacy.consider(a, st, decs)
			if deny && !d.Allowed && !st.shadow {
				violated = append(violated, a)
				violatedDesc = append(violatedDesc, i)
			}
		}
	}
	var hb headerBuilder
	var bufArr [512]byte
	buf := bufArr[:0]
	if s.opts.Headers.ietf() && nPolicies > 0 {
		if policiesOK {
			buf = hb.add(buf, HeaderRateLimitPolicy, policies...)
		}
		if nLimits > 0 && limitsOK {
			buf = hb.add(buf, HeaderRateLimit, limits...)
		}
	}
	if s.opts.Headers.legacy() && legacy.ok {
		buf = s.addLegacyHeaders(&hb, buf, decs[legacy.a.hit], legacy.a.spec)
	}
	if s.opts.NearLimitHeader && len(near) > 0 {
		var arr [128]byte
		b := arr[:0]
		for i, in := range near {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, in.quoted...)
		}
		buf = hb.add(buf, HeaderNearLimit, b...)
	}
	if deny && !s.opts.OmitProblem {
		body, secs := s.problemBody(ds, decs, outs, violated, violatedDesc)
		if body != nil {
			resp.RawBody = body
			hb.addConst(HeaderContentType, ProblemContentType)
		}
		buf = hb.addInt(buf, HeaderRetryAfter, secs)
	}
	resp.ResponseHeadersToAdd = hb.build(blk, buf)
}

// appendLimitItem appends the RateLimit item of one limit (its quoted
// policy name with r= remaining units and t= seconds until the window
// frees them, draft-ietf-httpapi-ratelimit-headers-10 §6); ok is false
// when an Integer is out of the RFC 9651 range.
func appendLimitItem(b []byte, in *specInfo, d algo.Decision) ([]byte, bool) {
	b = append(b, in.quoted...)
	b, ok1 := appendSFIntParam(b, "r", max(d.Remaining, 0))
	b, ok2 := appendSFIntParam(b, "t", atLeast1(ceilSeconds(d.WindowAfter)))
	return b, ok1 && ok2
}

// legacyPick is the limit the X-RateLimit-* headers report.
type legacyPick struct {
	a      applied
	ok     bool // a is set
	denied bool // a denied and fails the request
}

// consider offers applied limit a of descriptor st (state not unknown):
// a denying limit that fails the request (not shadow, not quota) wins,
// the last one, as envoyproxy/ratelimit picks; else the least remaining,
// first on ties.
func (p *legacyPick) consider(a applied, st *descState, decs []algo.Decision) {
	d := decs[a.hit]
	switch {
	case !d.Allowed && !st.shadow && !st.quota:
		p.a, p.ok, p.denied = a, true, true
	case !p.denied && (!p.ok || d.Remaining < decs[p.a.hit].Remaining):
		p.a, p.ok = a, true
	}
}

// addLegacyHeaders adds the three X-RateLimit-* headers (names from
// Options.LegacyHeaderNames) of decision d of limit sp: the rate, the
// units remaining (the answer policy's) and the
// whole seconds until reset (at least 1).
func (s *Service) addLegacyHeaders(hb *headerBuilder, buf []byte, d algo.Decision, sp *policy.Spec) []byte {
	names := &s.opts.LegacyHeaderNames
	buf = hb.addInt(buf, names.Limit, sp.Limit.Rate)
	buf = hb.addInt(buf, names.Remaining, s.answers.remaining(d))
	return hb.addInt(buf, names.Reset, atLeast1(ceilSeconds(d.ResetAfter)))
}

// maxHeaders bounds the headers one response sets: RateLimit-Policy,
// RateLimit, the three legacy headers, Ratelimitd-Near-Limit,
// Content-Type, Retry-After.
const maxHeaders = 8

// headerBuilder collects response headers in order; their computed values
// are appended to one buffer (owned by the caller, so that it can live on
// the stack) and share one string in the response.
type headerBuilder struct {
	n    int
	hdrs [maxHeaders]struct {
		key, constant string // constant: the value, when not in the buffer
		start, end    int
	}
}

// add appends header key with value v (copied to buf); it returns buf.
func (h *headerBuilder) add(buf []byte, key string, v ...byte) []byte {
	e := &h.hdrs[h.n]
	e.key, e.start = key, len(buf)
	buf = append(buf, v...)
	e.end = len(buf)
	h.n++
	return buf
}

// addInt appends header key with the decimal value n; it returns buf.
func (h *headerBuilder) addInt(buf []byte, key string, n int64) []byte {
	e := &h.hdrs[h.n]
	e.key, e.start = key, len(buf)
	buf = strconv.AppendInt(buf, n, 10)
	e.end = len(buf)
	h.n++
	return buf
}

// addConst appends header key with the constant value v.
func (h *headerBuilder) addConst(key, v string) {
	e := &h.hdrs[h.n]
	e.key, e.constant = key, v
	h.n++
}

// build returns the headers (nil when none), the first blockHeaders of
// them in blk.
func (h *headerBuilder) build(blk *responseBlock, buf []byte) []*corev3.HeaderValue {
	if h.n == 0 {
		return nil
	}
	all := string(buf)
	hs := blk.hp[:0]
	for i := range h.n {
		e := &h.hdrs[i]
		var hv *corev3.HeaderValue
		if i < len(blk.hv) {
			hv = &blk.hv[i]
		} else {
			hv = new(corev3.HeaderValue)
		}
		hv.Key = e.key
		if e.constant != "" {
			hv.Value = e.constant
		} else {
			hv.Value = all[e.start:e.end]
		}
		hs = append(hs, hv)
	}
	return hs
}
