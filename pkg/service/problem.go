package service

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Problem types (draft-ietf-httpapi-ratelimit-headers-10 §9), appended to
// Options.ProblemTypeBase.
const (
	// ProblemQuotaExceeded is the type of a denial by a counted limit.
	ProblemQuotaExceeded = "quota-exceeded"
	// ProblemTemporaryReducedCapacity is the type of a denial made only
	// by limits that failed closed (the backend could not decide) or by
	// the share of a limit with reserve that requests other than the
	// critical ones may use (a shed request).
	ProblemTemporaryReducedCapacity = "temporary-reduced-capacity"
)

// Problem is the RFC 9457 problem document sent as raw_body on
// OVER_LIMIT (docs/responses.md, "raw_body on OVER_LIMIT").
type Problem struct {
	// Type is Options.ProblemTypeBase followed by ProblemQuotaExceeded
	// or ProblemTemporaryReducedCapacity (RFC 9457 §3.1.1).
	Type string `json:"type"`
	// Title is "Quota Exceeded" or "Temporary Reduced Capacity"
	// (RFC 9457 §3.1.3).
	Title string `json:"title"`
	// Status is the HTTP status Envoy answers with, 429 (RFC 9457 §3.1.2).
	Status int `json:"status"`
	// Detail is one sentence naming the policy, its quota and window and
	// the retry delay, or Options.ProblemDetail with its placeholders
	// filled (RFC 9457 §3.1.4).
	Detail string `json:"detail"`
	// ViolatedPolicies are the policy names of the limits that denied,
	// in response order without repeats; [] (never null) when none
	// (draft-ietf-httpapi-ratelimit-headers-10 §9).
	ViolatedPolicies []string `json:"violated-policies"`
	// RetryAfter is the delay in whole seconds (at least 1), equal to the
	// Retry-After header.
	RetryAfter int64 `json:"retry_after"`
}

// problemBody returns the JSON problem document of a denied request and
// the Retry-After delay in whole seconds (at least 1, jitter included):
// the longest wait of the violated limits (violated[i] applied in
// descriptor ds[violatedDesc[i]]). The document is temporary reduced
// capacity when only limits that failed closed denied, or only those and
// the reserve shares of non-critical requests (policy.Rule.Reduced).
// body is nil when the document cannot be encoded.
func (s *Service) problemBody(ds []descState, decs []algo.Decision, outs []outcome, violated []applied, violatedDesc []int) (body []byte, secs int64) {
	var exact time.Duration
	closedOnly := len(violated) > 0
	// shedOnly: every violated limit failed closed or is a reserve
	// share, and at least one is a share.
	shedOnly, shed := len(violated) > 0, false
	var names []string
	seen := map[string]bool{}
	var first, pen applied
	var firstDesc, penDesc *descState
	for i, a := range violated {
		d := decs[a.hit]
		if d.Penalty != algo.PenaltyNone && outs[a.hit] != byFailedClosed && penDesc == nil {
			pen, penDesc = a, &ds[violatedDesc[i]]
		}
		exact = max(exact, d.RetryAfter, d.WindowAfter)
		switch {
		case outs[a.hit] == byFailedClosed:
		case ds[violatedDesc[i]].match.Rule.Reduced:
			shed = true
		default:
			shedOnly = false
		}
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
	if penDesc != nil {
		// the detail says the client is blocked
		first, firstDesc = pen, penDesc
	}
	secs = atLeast1(ceilSeconds(exact + s.jitter()))
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
	if shedOnly && shed {
		p.Type = s.opts.ProblemTypeBase + ProblemTemporaryReducedCapacity
		p.Title = "Temporary Reduced Capacity"
	}
	p.Detail = s.detail(firstDesc, first, closedOnly, penDesc != nil, secs)
	body, err := json.Marshal(p)
	if err != nil {
		return nil, secs
	}
	return body, secs
}

// detail renders the problem "detail" member.
func (s *Service) detail(st *descState, a applied, closed, blocked bool, retry int64) string {
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
	if blocked && st != nil {
		p := st.match.Rule.Penalty
		return fmt.Sprintf("Policy %q was exceeded %d times within %d seconds, so this client is blocked for %d seconds; retry after %d seconds.", name, p.After, atLeast1(ceilSeconds(p.Within)), atLeast1(ceilSeconds(p.Block)), retry)
	}
	if st != nil && st.match.Rule.Reduced {
		return fmt.Sprintf("Policy %q keeps its remaining capacity for critical requests; this request may use %d and is shed; retry after %d seconds.", name, quota, retry)
	}
	if a.spec != nil && a.spec.Limit.Kind == algo.Concurrency {
		return fmt.Sprintf("Policy %q allows %d concurrent requests; retry after %d seconds.", name, quota, retry)
	}
	return fmt.Sprintf("Policy %q allows %d requests per %d seconds; retry after %d seconds.", name, quota, win, retry)
}
