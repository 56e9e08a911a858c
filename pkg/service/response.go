package service

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
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
	HeaderLegacyLimit     = "X-RateLimit-Limit"     // requests_per_unit of the chosen limit
	HeaderLegacyRemaining = "X-RateLimit-Remaining" // limit_remaining of the chosen limit
	HeaderLegacyReset     = "X-RateLimit-Reset"     // seconds until reset of the chosen limit
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
func (s *Service) status(st *descState, decs []algo.Decision, outs []outcome) *rlsv3.RateLimitResponse_DescriptorStatus {
	ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
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
	ds.CurrentLimit = currentLimit(a.spec)
	ds.LimitRemaining = clampU32(d.Remaining)
	reset := d.ResetAfter
	if outs[a.hit] == byFailedOpen {
		reset = window(a.spec)
	}
	ds.DurationUntilReset = durationpb.New(time.Duration(atLeast1(ceilSeconds(reset))) * time.Second)
	return ds
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

func currentLimit(sp *policy.Spec) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{
		Name:            sp.Name,
		RequestsPerUnit: sp.RequestsPerUnit,
		Unit:            responseUnit(sp.Unit),
	}
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
func policyName(st *descState, sp *policy.Spec) string {
	n := sp.Policy
	if n == "" {
		n = sp.Name
	}
	if n == "" {
		n = st.match.Rule.Path
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '_'
		}
		return r
	}, n)
}

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }

// addHeaders fills response_headers_to_add and, when the request is
// denied (after global shadow mode), Retry-After, Content-Type and
// raw_body.
func (s *Service) addHeaders(resp *rlsv3.RateLimitResponse, ds []descState, decs []algo.Decision, outs []outcome, deny bool) {
	var policies, limits httpsfv.List
	var near []string
	type pick struct {
		a  applied
		ok bool
	}
	var legacy pick
	legacyDenied := false
	var violated []applied
	var violatedDesc []*descState
	for i := range ds {
		st := &ds[i]
		for _, a := range st.applied {
			d := decs[a.hit]
			name := policyName(st, a.spec)
			pi := httpsfv.NewItem(name)
			pi.Params.Add("q", a.spec.Limit.Rate)
			if a.spec.Limit.Kind == algo.Concurrency {
				pi.Params.Add("qu", "concurrent-requests")
			} else {
				pi.Params.Add("w", atLeast1(ceilSeconds(window(a.spec))))
			}
			policies = append(policies, pi)
			if outs[a.hit] == byFailedOpen {
				continue // state unknown: no RateLimit item, no legacy pick
			}
			li := httpsfv.NewItem(name)
			li.Params.Add("r", max(d.Remaining, 0))
			li.Params.Add("t", atLeast1(ceilSeconds(d.WindowAfter)))
			limits = append(limits, li)
			if s.nearLimit(a.spec, d) {
				near = append(near, name)
			}
			// Legacy: a denying (non-shadow) limit wins, the last one
			// (reference 3.7); else the least remaining, first on ties.
			switch {
			case !d.Allowed && !st.shadow:
				legacy, legacyDenied = pick{a, true}, true
			case !legacyDenied && (!legacy.ok || d.Remaining < decs[legacy.a.hit].Remaining):
				legacy = pick{a, true}
			}
			if deny && !d.Allowed && !st.shadow {
				violated = append(violated, a)
				violatedDesc = append(violatedDesc, st)
			}
		}
	}
	var hs []*corev3.HeaderValue
	if s.opts.Headers.ietf() && len(policies) > 0 {
		if v, err := httpsfv.Marshal(policies); err == nil {
			hs = append(hs, header(HeaderRateLimitPolicy, v))
		}
		if len(limits) > 0 {
			if v, err := httpsfv.Marshal(limits); err == nil {
				hs = append(hs, header(HeaderRateLimit, v))
			}
		}
	}
	if s.opts.Headers.legacy() && legacy.ok {
		d := decs[legacy.a.hit]
		hs = append(hs,
			header(HeaderLegacyLimit, strconv.FormatInt(legacy.a.spec.Limit.Rate, 10)),
			header(HeaderLegacyRemaining, strconv.FormatInt(max(d.Remaining, 0), 10)),
			header(HeaderLegacyReset, strconv.FormatInt(atLeast1(ceilSeconds(d.ResetAfter)), 10)),
		)
	}
	if s.opts.NearLimitHeader && len(near) > 0 {
		l := make(httpsfv.List, len(near))
		for i, n := range near {
			l[i] = httpsfv.NewItem(n)
		}
		if v, err := httpsfv.Marshal(l); err == nil {
			hs = append(hs, header(HeaderNearLimit, v))
		}
	}
	if deny {
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
					first, firstDesc = a, violatedDesc[i]
				}
				closedOnly = false
			} else if firstDesc == nil {
				first, firstDesc = a, violatedDesc[i]
			}
			n := policyName(violatedDesc[i], a.spec)
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
			hs = append(hs, header(HeaderContentType, ProblemContentType))
		}
		hs = append(hs, header(HeaderRetryAfter, strconv.FormatInt(secs, 10)))
	}
	resp.ResponseHeadersToAdd = hs
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
func (s *Service) observeDecisions(domain string, ds []descState, decs []algo.Decision, outs []outcome) {
	capper := s.detailed.Load()
	for i := range ds {
		st := &ds[i]
		if len(st.applied) == 0 {
			continue
		}
		rule := st.match.Rule.Path
		switch {
		case st.override:
			rule = LabelOverride
		case st.match.Rule.DetailedMetric && s.opts.DetailedMetricCap > 0 && st.match.MetricKey != "":
			rule = capper.label(validUTF8(st.match.MetricKey)) // request values: labels must be UTF-8
		}
		result := resultOK
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
			result = resultFailedClosed
		case st.denied && st.shadow:
			result = resultShadow
		case st.denied:
			result = resultOverLimit
		case open:
			result = resultFailedOpen
		case near:
			result = resultNearLimit
		}
		s.m.decisions.WithLabelValues(domain, rule, result).Inc()
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
