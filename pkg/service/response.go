package service

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

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

// Problem types (draft-ietf-httpapi-ratelimit-headers-10 §9), appended to
// Options.ProblemTypeBase.
const (
	ProblemQuotaExceeded            = "quota-exceeded"
	ProblemTemporaryReducedCapacity = "temporary-reduced-capacity"
)

// Problem is the RFC 9457 problem document sent as raw_body on
// OVER_LIMIT. RetryAfter equals the Retry-After header.
type Problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies"`
	RetryAfter       int64    `json:"retry_after"`
}

// ceilSeconds rounds d up to whole seconds (0 for d <= 0).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func atLeast1(n int64) int64 { return max(n, 1) }

func clampU32(n int64) uint32 {
	switch {
	case n < 0:
		return 0
	case n > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(n)
}

// status builds the DescriptorStatus of one descriptor (contract,
// "Statuses without a counted limit" and "Several limits on one node").
func (s *Service) status(st *descState, decs []algo.Decision, outs []outcome, p *statusParts) *rlsv3.RateLimitResponse_DescriptorStatus {
	ds := &p.status
	ds.Code = rlsv3.RateLimitResponse_OK
	st.status = ds
	if !st.matched {
		return ds
	}
	if st.match.Rule.Unlimited {
		ds.LimitRemaining = math.MaxUint32
		return ds
	}
	if len(st.applied) == 0 {
		return ds
	}
	a := reported(st, decs, outs)
	d := decs[a.hit]
	if st.denied && !st.shadow {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	ds.CurrentLimit = currentLimit(a.spec, &p.limit)
	ds.LimitRemaining = clampU32(d.Remaining)
	if !d.Allowed && s.opts.ReferenceAnswers {
		ds.LimitRemaining = 0
	}
	reset := d.ResetAfter
	if outs[a.hit] == byFailedOpen {
		reset = window(a.spec)
	}
	ds.DurationUntilReset = setDuration(&p.duration, time.Duration(atLeast1(ceilSeconds(reset)))*time.Second)
	return ds
}

// setDuration sets p to d as durationpb.New does and returns p.
func setDuration(p *durationpb.Duration, d time.Duration) *durationpb.Duration {
	nanos := d.Nanoseconds()
	p.Seconds = nanos / 1e9
	p.Nanos = int32(nanos % 1e9)
	return p
}

// statusParts are the messages of one DescriptorStatus, allocated together.
type statusParts struct {
	status   rlsv3.RateLimitResponse_DescriptorStatus
	limit    rlsv3.RateLimitResponse_RateLimit
	duration durationpb.Duration
}

// blockHeaders is the number of response headers a responseBlock holds
// without allocating (RateLimit-Policy, RateLimit, Retry-After,
// Content-Type; more allocate).
const blockHeaders = 4

// responseBlock is a response with the messages a one-descriptor answer
// needs, allocated in one piece; the response points into it.
type responseBlock struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	parts    [1]statusParts
	more     []statusParts // parts of the descriptors after the first
	hv       [blockHeaders]corev3.HeaderValue
	hp       [blockHeaders]*corev3.HeaderValue
}

// newResponseBlock returns a block whose resp.Statuses has n (nil) entries.
func newResponseBlock(n int) *responseBlock {
	b := &responseBlock{}
	if n <= len(b.statuses) {
		b.resp.Statuses = b.statuses[:n]
	} else {
		b.resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
		b.more = make([]statusParts, n-1)
	}
	return b
}

// statusParts returns the parts of descriptor i.
func (b *responseBlock) statusParts(i int) *statusParts {
	if i == 0 {
		return &b.parts[0]
	}
	return &b.more[i-1]
}

// reported picks the limit a descriptor's status reports: the first that
// denied, else the least remaining (ties: config order). Failed-open
// limits (state unknown) are reported only when nothing else applied.
func reported(st *descState, decs []algo.Decision, outs []outcome) applied {
	best := -1
	for i, a := range st.applied {
		if !decs[a.hit].Allowed {
			return a
		}
		if outs[a.hit] == byFailedOpen {
			continue
		}
		if best < 0 || decs[a.hit].Remaining < decs[st.applied[best].hit].Remaining {
			best = i
		}
	}
	if best < 0 {
		best = 0
	}
	return st.applied[best]
}

// currentLimit fills rl with the Spec's limit and returns it.
func currentLimit(sp *policy.Spec, rl *rlsv3.RateLimitResponse_RateLimit) *rlsv3.RateLimitResponse_RateLimit {
	rl.Name = sp.Name
	rl.RequestsPerUnit = sp.RequestsPerUnit
	rl.Unit = responseUnit(sp.Unit)
	if sp.UnitMultiplier > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(sp.UnitMultiplier)
	}
	return rl
}

// window is the quota window of a Spec (w=): Spec.Window, else the
// algorithm period.
func window(sp *policy.Spec) time.Duration {
	if sp.Window > 0 {
		return sp.Window
	}
	return sp.Limit.Period
}

// capacity is the number of units a full state admits: the token bucket
// burst, else the rate.
func capacity(l algo.Limit) int64 {
	if l.Kind == algo.TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// nearLimit reports an allowed decision that leaves the used share above
// floor(capacity × ratio) (envoyproxy/ratelimit's near_limit threshold).
func (s *Service) nearLimit(sp *policy.Spec, d algo.Decision) bool {
	c := capacity(sp.Limit)
	if !d.Allowed || c <= 0 {
		return false
	}
	threshold := int64(math.Floor(float64(c) * s.opts.NearLimitRatio))
	return c-d.Remaining > threshold
}

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
// Retry-After, Content-Type and raw_body.
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
	type pick struct {
		a  applied
		ok bool
	}
	var legacy pick
	legacyDenied := false
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
			limits = append(limits, a.info.quoted...)
			var ok1, ok2 bool
			limits, ok1 = appendSFIntParam(limits, "r", max(d.Remaining, 0))
			limits, ok2 = appendSFIntParam(limits, "t", atLeast1(ceilSeconds(d.WindowAfter)))
			limitsOK = limitsOK && ok1 && ok2
			nLimits++
			if s.nearLimit(a.spec, d) {
				near = append(near, a.info)
			}
			// Legacy: a denying limit that fails the request (not shadow,
			// not quota) wins, the last one, as envoyproxy/ratelimit
			// picks; else the least remaining, first on ties.
			switch {
			case !d.Allowed && !st.shadow && !st.quota:
				legacy, legacyDenied = pick{a, true}, true
			case !legacyDenied && (!legacy.ok || d.Remaining < decs[legacy.a.hit].Remaining):
				legacy = pick{a, true}
			}
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
		d := decs[legacy.a.hit]
		names := &s.opts.LegacyHeaderNames
		buf = hb.addInt(buf, names.Limit, legacy.a.spec.Limit.Rate)
		left := max(d.Remaining, 0)
		if !d.Allowed && s.opts.ReferenceAnswers {
			left = 0
		}
		buf = hb.addInt(buf, names.Remaining, left)
		buf = hb.addInt(buf, names.Reset, atLeast1(ceilSeconds(d.ResetAfter)))
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
		var exact time.Duration
		closedOnly := len(violated) > 0
		var names []string
		seen := map[string]bool{}
		var first applied
		var firstDesc *descState
		for i, a := range violated {
			d := decs[a.hit]
			exact = max(exact, d.RetryAfter, d.WindowAfter)
			if outs[a.hit] != byFailedClosed {
				if closedOnly || firstDesc == nil {
					first, firstDesc = a, &ds[violatedDesc[i]]
				}
				closedOnly = false
			} else if firstDesc == nil {
				first, firstDesc = a, &ds[violatedDesc[i]]
			}
			n := a.info.name
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
		secs := atLeast1(ceilSeconds(exact + s.jitter()))
		p := Problem{
			Type:             s.opts.ProblemTypeBase + ProblemQuotaExceeded,
			Title:            "Quota Exceeded",
			Status:           429,
			ViolatedPolicies: names,
			RetryAfter:       secs,
		}
		if p.ViolatedPolicies == nil {
			p.ViolatedPolicies = []string{}
		}
		if closedOnly {
			p.Type = s.opts.ProblemTypeBase + ProblemTemporaryReducedCapacity
			p.Title = "Temporary Reduced Capacity"
		}
		p.Detail = s.detail(firstDesc, first, closedOnly, secs)
		body, err := json.Marshal(p)
		if err == nil {
			resp.RawBody = body
			hb.addConst(HeaderContentType, ProblemContentType)
		}
		buf = hb.addInt(buf, HeaderRetryAfter, secs)
	}
	resp.ResponseHeadersToAdd = hb.build(blk, buf)
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

// detail renders the problem "detail" member.
func (s *Service) detail(st *descState, a applied, closed bool, retry int64) string {
	name, quota, win := "", int64(0), int64(0)
	if st != nil && a.spec != nil {
		name = policyName(st, a.spec)
		quota = a.spec.Limit.Rate
		win = atLeast1(ceilSeconds(window(a.spec)))
	}
	if s.opts.ProblemDetail != "" {
		return strings.NewReplacer(
			"{policy}", name,
			"{quota}", strconv.FormatInt(quota, 10),
			"{window}", strconv.FormatInt(win, 10),
			"{retry_after}", strconv.FormatInt(retry, 10),
		).Replace(s.opts.ProblemDetail)
	}
	if closed {
		return fmt.Sprintf("The rate limit backend is unavailable and policy %q fails closed; retry after %d seconds.", name, retry)
	}
	if a.spec != nil && a.spec.Limit.Kind == algo.Concurrency {
		return fmt.Sprintf("Policy %q allows %d concurrent requests; retry after %d seconds.", name, quota, retry)
	}
	return fmt.Sprintf("Policy %q allows %d requests per %d seconds; retry after %d seconds.", name, quota, win, retry)
}

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
		if cached != nil {
			cached.decisions[result].get(s.m.decisions, domain, rule, resultLabels[result]).Inc()
		} else {
			s.m.decisions.WithLabelValues(domain, rule, resultLabels[result]).Inc()
		}
		if s.ref != nil {
			s.observeRef(sn, st, rule, decs, outs)
		}
	}
}

// dynamicMetadata builds the RESPONSE_DYNAMIC_METADATA struct of
// envoyproxy/ratelimit (reference 3.9): domain, descriptors (entries as
// "key=value", limit override as text, hitsAddend), request hitsAddend,
// and metadata = deep merge (first value wins) of the config metadata of
// every matched descriptor that is not OVER_LIMIT. Request strings that
// are not valid UTF-8 (possible only for in-process callers; the gRPC codec
// escapes them) appear in their escaped form (InvalidUTF8Prefix + hex).
func (s *Service) dynamicMetadata(req *rlsv3.RateLimitRequest, ds []descState) *structpb.Struct {
	descs := make([]any, len(req.GetDescriptors()))
	for i, d := range req.GetDescriptors() {
		es := make([]any, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			es[j] = validUTF8(e.GetKey()) + "=" + validUTF8(e.GetValue()) // structpb strings must be UTF-8
		}
		m := map[string]any{"entries": es}
		if l := d.GetLimit(); l != nil {
			m["limit"] = fmt.Sprintf("requests_per_unit:%d unit:%s", l.GetRequestsPerUnit(), l.GetUnit())
		}
		if h := d.GetHitsAddend(); h != nil {
			m["hitsAddend"] = float64(h.GetValue())
		}
		descs[i] = m
	}
	out := map[string]any{"domain": validUTF8(req.GetDomain()), "descriptors": descs}
	if h := req.GetHitsAddend(); h != 0 {
		out["hitsAddend"] = float64(h)
	}
	merged := map[string]any{}
	for i := range ds {
		st := &ds[i]
		if !st.matched || st.status == nil || st.status.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		mergeFirstWins(merged, st.match.Rule.Metadata)
	}
	if len(merged) > 0 {
		out["metadata"] = merged
	}
	v, err := structpb.NewStruct(out)
	if err != nil {
		s.opts.Logger.Warn("service: dynamic metadata not representable", "error", err)
		delete(out, "metadata")
		v, _ = structpb.NewStruct(out)
	}
	return v
}

// mergeFirstWins merges src into dst without touching src: maps merge
// recursively, and on any other conflict the value already in dst stays.
func mergeFirstWins(dst map[string]any, src map[string]any) {
	for k, v := range src {
		old, ok := dst[k]
		if !ok {
			dst[k] = normalize(v)
			continue
		}
		om, ok1 := old.(map[string]any)
		if nm := asMap(v); ok1 && nm != nil {
			mergeFirstWins(om, nm)
		}
	}
}

func asMap(v any) map[string]any {
	switch m := v.(type) {
	case map[string]any:
		return m
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, x := range m {
			out[fmt.Sprint(k)] = x
		}
		return out
	}
	return nil
}

// normalize deep-copies a YAML value into types structpb accepts.
func normalize(v any) any {
	if m := asMap(v); m != nil {
		out := make(map[string]any, len(m))
		for k, x := range m {
			out[k] = normalize(x)
		}
		return out
	}
	switch x := v.(type) {
	case nil, bool, string, float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return x
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	}
	return fmt.Sprint(v)
}
