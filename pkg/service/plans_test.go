package service_test

// Plan tiers × route classes through the real gRPC handler (bufconn, real
// policy loaded from examples/plans, pkg/backend/memory on the test clock),
// with the descriptors that envoy/plans.yaml sends.
//
// Units: every limit of examples/plans/api.yaml is per MINUTE (60 s). The
// test clock starts at t0 = 00:00:30 UTC, 30 s into a minute, so a fixed
// window has 30 s left. RateLimit-Policy w and RateLimit t are seconds;
// duration_until_reset is a duration rounded up to whole seconds.

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/replay"
)

const (
	plansConfig = "../../examples/plans"
	plansEnvoy  = "../../envoy/plans.yaml"
	minute      = rlsv3.RateLimitResponse_RateLimit_MINUTE
)

// plansEnv is a service running examples/plans (domain "api").
func plansEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, nil)
	e.svc.SetPolicy(loadSet(t, plansConfig))
	return e
}

// envoyRequest is an HTTP request as the rate-limit filter of
// envoy/plans.yaml sees it: x-plan is the header the ext_authz service set
// (the client's copy was stripped), x-api-key the client's credential.
type envoyRequest struct {
	path, plan, apiKey, client string
}

// envoyDescriptors routes r through envoy/plans.yaml exactly as Envoy would
// (pkg/replay reproduces route matching and the rate_limits actions) and
// returns the descriptors sent before the request is forwarded.
func envoyDescriptors(t *testing.T, r envoyRequest) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	h := map[string]string{}
	if r.plan != "" {
		h["x-plan"] = r.plan
	}
	if r.apiKey != "" {
		h["x-api-key"] = r.apiKey
	}
	client := r.client
	if client == "" {
		client = "192.0.2.10"
	}
	rt := envoyRoute(t, plansEnvoy, "api", &replay.Request{Client: netip.MustParseAddr(client), Method: "GET", Path: r.path, Headers: h})
	if len(rt.OnStreamDone) != 0 {
		t.Errorf("%s: unexpected apply_on_stream_done descriptors %v", r.path, rt.OnStreamDone)
	}
	return rlsDescriptors(rt.Descriptors)
}

// envoyRoute loads an Envoy bootstrap, checks its rate-limit domain and
// matches one request as Envoy would.
func envoyRoute(t *testing.T, file, domain string, r *replay.Request) replay.Route {
	t.Helper()
	e, err := replay.LoadEnvoy(file)
	if err != nil {
		t.Fatal(err)
	}
	if e.Domain != domain {
		t.Fatalf("%s: domain %q, want %q", file, e.Domain, domain)
	}
	rt, ok := e.Match("", r)
	if !ok {
		t.Fatalf("%s: no route for %s", file, r.Path)
	}
	return rt
}

// rlsDescriptors converts replay descriptors to the RLS request form.
func rlsDescriptors(ds []replay.Descriptor) []*rlcommon.RateLimitDescriptor {
	var out []*rlcommon.RateLimitDescriptor
	for _, d := range ds {
		x := &rlcommon.RateLimitDescriptor{}
		for _, en := range d.Entries {
			x.Entries = append(x.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: en.Key, Value: en.Value})
		}
		out = append(out, x)
	}
	return out
}

// entriesOf renders descriptors as [[k=v ...] ...] for comparisons.
func entriesOf(ds []*rlcommon.RateLimitDescriptor) [][]policy.Entry {
	var out [][]policy.Entry
	for _, d := range ds {
		var es []policy.Entry
		for _, en := range d.GetEntries() {
			es = append(es, policy.Entry{Key: en.GetKey(), Value: en.GetValue()})
		}
		out = append(out, es)
	}
	return out
}

func entryList(kv ...string) []policy.Entry {
	var out []policy.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, policy.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// TestPlansEnvoyDescriptors pins what envoy/plans.yaml sends for each kind
// of request (the envoy package checks that every shape matches some rule;
// this checks the exact descriptors, route class values included).
func TestPlansEnvoyDescriptors(t *testing.T) {
	plan := entryList("plan", "pro", "api_key", "k1")
	for _, tc := range []struct {
		req  envoyRequest
		want [][]policy.Entry
	}{
		{envoyRequest{path: "/v1/search?q=x", plan: "pro", apiKey: "k1"}, [][]policy.Entry{append(entryList("plan", "pro", "api_key", "k1"), policy.Entry{Key: "route", Value: "search"}), plan}},
		{envoyRequest{path: "/v1/search/advanced", plan: "pro", apiKey: "k1"}, [][]policy.Entry{append(entryList("plan", "pro", "api_key", "k1"), policy.Entry{Key: "route", Value: "search"}), plan}},
		{envoyRequest{path: "/v1/reports/2026-01", plan: "pro", apiKey: "k1"}, [][]policy.Entry{append(entryList("plan", "pro", "api_key", "k1"), policy.Entry{Key: "route", Value: "reports"}), plan}},
		{envoyRequest{path: "/v1/ai", plan: "pro", apiKey: "k1"}, [][]policy.Entry{append(entryList("plan", "pro", "api_key", "k1"), policy.Entry{Key: "route", Value: "ai"}), plan}},
		// Not a route class: /v1/searchable is not under /v1/search.
		{envoyRequest{path: "/v1/searchable", plan: "pro", apiKey: "k1"}, [][]policy.Entry{plan}},
		{envoyRequest{path: "/v1/users/me", plan: "pro", apiKey: "k1"}, [][]policy.Entry{plan}},
		// Anonymous: only the client address, whatever the path.
		{envoyRequest{path: "/v1/search?q=x", client: "198.51.100.7"}, [][]policy.Entry{entryList("remote_address", "198.51.100.7")}},
		{envoyRequest{path: "/", client: "2001:db8::1"}, [][]policy.Entry{entryList("remote_address", "2001:db8::1")}},
		// A key without a plan (ext_authz did not set x-plan): Envoy sends
		// nothing, which is why failure_mode_allow is false on ext_authz.
		{envoyRequest{path: "/v1/search", apiKey: "k1"}, nil},
	} {
		t.Run(tc.req.path+"/"+tc.req.apiKey, func(t *testing.T) {
			got := entriesOf(envoyDescriptors(t, tc.req))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("descriptors (-want +got):\n%s", diff)
			}
		})
	}
}

// tierSpec is what examples/plans/api.yaml gives one tier, as the service
// reports it: current_limit, and after one request at t0 the remaining
// units, duration_until_reset and the RateLimit t parameter.
type tierSpec struct {
	rpu    uint32 // requests_per_unit, per minute
	remain uint32 // after one request
	reset  time.Duration
	t      int64 // RateLimit t, seconds
}

// The plan limits: token buckets refilling requests_per_unit per minute,
// capacity burst. After one request a bucket holds burst−1 tokens and is
// full again, and has its next token, within ceil(60 s / rpu) = 1 s.
var planSpecs = map[string]tierSpec{
	"free":       {rpu: 60, remain: 10 - 1, reset: time.Second, t: 1},
	"pro":        {rpu: 1000, remain: 100 - 1, reset: time.Second, t: 1},
	"enterprise": {rpu: 10000, remain: 1000 - 1, reset: time.Second, t: 1},
}

// routeSpecs are the route classes per tier. search and reports are fixed
// windows (reset at the end of the minute, 30 s after t0); ai is a sliding
// window counter: the request counts fully until the minute ends (30 s) and
// then decays over the next minute, so the state is clear again, and a
// unit beyond r is available again (t), only 90 s after t0.
func routeSpec(tier, route string) tierSpec {
	switch route {
	case "search":
		return tierSpec{rpu: 60, remain: 59, reset: 30 * time.Second, t: 30}
	case "reports":
		return tierSpec{rpu: 10, remain: 9, reset: 30 * time.Second, t: 30}
	case "ai":
		if tier == "enterprise" {
			return tierSpec{rpu: 100, remain: 99, reset: 90 * time.Second, t: 90}
		}
		return tierSpec{rpu: 10, remain: 9, reset: 90 * time.Second, t: 90}
	}
	panic("unknown route " + route)
}

// TestPlanRouteMatrix sends, for every tier × route class, the descriptors
// Envoy sends and checks statuses, current_limit and the RateLimit headers
// (parsed back with httpsfv, an RFC 9651 parser): policy names carry the
// plan ("pro", "pro/search"), so clients see their plan.
func TestPlanRouteMatrix(t *testing.T) {
	paths := map[string]string{"search": "/v1/search?q=rate", "reports": "/v1/reports/monthly", "ai": "/v1/ai/complete", "": "/v1/users/me"}
	for _, tier := range []string{"free", "pro", "enterprise", "internal"} {
		for _, route := range []string{"search", "reports", "ai", ""} {
			name := tier + "/" + route
			if route == "" {
				name = tier + "/no-route-class"
			}
			t.Run(name, func(t *testing.T) {
				e := plansEnv(t)
				ds := envoyDescriptors(t, envoyRequest{path: paths[route], plan: tier, apiKey: "key-" + tier})
				wantN := 2
				if route == "" {
					wantN = 1
				}
				if len(ds) != wantN {
					t.Fatalf("Envoy sends %d descriptors, want %d: %v", len(ds), wantN, entriesOf(ds))
				}
				resp := e.call(t, req("api", ds...))
				h := headers(t, resp)

				if tier == "internal" {
					// Unlimited tier: its route classes are unlimited too;
					// no limit applied, so no headers.
					want := []*rlsv3.RateLimitResponse_DescriptorStatus{st(OK, nil, math.MaxUint32, 0)}
					if route != "" {
						want = append(want, st(OK, nil, math.MaxUint32, 0))
					}
					checkStatuses(t, "internal", resp, OK, want...)
					if len(h) != 0 {
						t.Errorf("headers for an unlimited plan: %v", h)
					}
					return
				}

				p := planSpecs[tier]
				planStatus := st(OK, limit(tier, p.rpu, minute), p.remain, p.reset)
				wantPolicy := []sfItem{}
				wantLimit := []sfItem{}
				var want []*rlsv3.RateLimitResponse_DescriptorStatus
				if route != "" {
					rs := routeSpec(tier, route)
					rn := tier + "/" + route
					want = append(want, st(OK, limit(rn, rs.rpu, minute), rs.remain, rs.reset))
					wantPolicy = append(wantPolicy, q(rn, int64(rs.rpu), 60))
					wantLimit = append(wantLimit, r(rn, int64(rs.remain), rs.t))
				}
				want = append(want, planStatus)
				wantPolicy = append(wantPolicy, q(tier, int64(p.rpu), 60))
				wantLimit = append(wantLimit, r(tier, int64(p.remain), p.t))
				checkStatuses(t, "first request", resp, OK, want...)
				if diff := cmp.Diff(wantPolicy, parseList(t, h["RateLimit-Policy"])); diff != "" {
					t.Errorf("RateLimit-Policy %q (-want +got):\n%s", h["RateLimit-Policy"], diff)
				}
				if diff := cmp.Diff(wantLimit, parseList(t, h["RateLimit"])); diff != "" {
					t.Errorf("RateLimit %q (-want +got):\n%s", h["RateLimit"], diff)
				}
				if h["Retry-After"] != "" || resp.GetRawBody() != nil {
					t.Errorf("allowed request carries a denial: %v %q", h, resp.GetRawBody())
				}
			})
		}
	}
}

// problem decodes an RFC 9457 body.
func problem(t *testing.T, resp *rlsv3.RateLimitResponse) map[string]any {
	t.Helper()
	var p map[string]any
	if err := json.Unmarshal(resp.GetRawBody(), &p); err != nil {
		t.Fatalf("problem body %q: %v", resp.GetRawBody(), err)
	}
	return p
}

// TestPlanRouteLimitExhausted: pro's reports class (10 per minute, fixed
// window) runs out long before pro's plan bucket (capacity 100): the 11th
// report is denied by "pro/reports", the plan limit is not charged for it,
// other route classes of the same key still pass, and the window's end
// (30 s after t0) lets reports through again.
func TestPlanRouteLimitExhausted(t *testing.T) {
	e := plansEnv(t)
	reports := envoyDescriptors(t, envoyRequest{path: "/v1/reports/q1", plan: "pro", apiKey: "acme"})
	rep := limit("pro/reports", 10, minute)
	pro := limit("pro", 1000, minute)
	for i := 1; i <= 10; i++ {
		checkStatuses(t, fmt.Sprint("report ", i), e.call(t, req("api", reports...)), OK,
			st(OK, rep, uint32(10-i), 30*time.Second), st(OK, pro, uint32(100-i), time.Second))
	}
	resp := e.call(t, req("api", reports...))
	// Denied: the plan descriptor reports its tokens before the request
	// (90 of 100), nothing was consumed.
	checkStatuses(t, "report 11", resp, OVER, st(OVER, rep, 0, 30*time.Second), st(OK, pro, 90, time.Second))
	h := headers(t, resp)
	if h["Content-Type"] != "application/problem+json" {
		t.Errorf("Content-Type %q", h["Content-Type"])
	}
	// The reports window ends 30 s after t0; Rand is 0: no jitter.
	if h["Retry-After"] != "30" {
		t.Errorf("Retry-After %q, want 30", h["Retry-After"])
	}
	if diff := cmp.Diff([]sfItem{q("pro/reports", 10, 60), q("pro", 1000, 60)}, parseList(t, h["RateLimit-Policy"])); diff != "" {
		t.Errorf("RateLimit-Policy (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]sfItem{r("pro/reports", 0, 30), r("pro", 90, 1)}, parseList(t, h["RateLimit"])); diff != "" {
		t.Errorf("RateLimit (-want +got):\n%s", diff)
	}
	wantProblem := map[string]any{
		"type":              "https://iana.org/assignments/http-problem-types#quota-exceeded",
		"title":             "Quota Exceeded",
		"status":            float64(429),
		"detail":            `Policy "pro/reports" allows 10 requests per 60 seconds; retry after 30 seconds.`,
		"violated-policies": []any{"pro/reports"},
		"retry_after":       float64(30),
	}
	if diff := cmp.Diff(wantProblem, problem(t, resp)); diff != "" {
		t.Errorf("problem (-want +got):\n%s", diff)
	}

	// The same key on another route class and on plain routes still passes.
	search := envoyDescriptors(t, envoyRequest{path: "/v1/search", plan: "pro", apiKey: "acme"})
	checkStatuses(t, "search", e.call(t, req("api", search...)), OK,
		st(OK, limit("pro/search", 60, minute), 59, 30*time.Second), st(OK, pro, 89, time.Second))
	// Another key of the same plan has its own reports counter.
	other := envoyDescriptors(t, envoyRequest{path: "/v1/reports/q1", plan: "pro", apiKey: "globex"})
	checkStatuses(t, "other key", e.call(t, req("api", other...)), OK,
		st(OK, rep, 9, 30*time.Second), st(OK, pro, 99, time.Second))

	// At 00:01:00 the reports window is new. The bucket refilled 30 s ×
	// 1000/min = 500 tokens, capped at its capacity of 100.
	e.clock.Advance(30 * time.Second)
	checkStatuses(t, "next window", e.call(t, req("api", reports...)), OK,
		st(OK, rep, 9, 60*time.Second), st(OK, pro, 99, time.Second))
}

// TestPlanLimitExhausted: free's plan bucket (capacity 10, one token per
// second) runs dry on the 11th request; the problem names "free", and one
// second later one token is back.
func TestPlanLimitExhausted(t *testing.T) {
	e := plansEnv(t)
	ds := envoyDescriptors(t, envoyRequest{path: "/v1/users/me", plan: "free", apiKey: "hobbyist"})
	free := limit("free", 60, minute)
	for i := 1; i <= 10; i++ {
		// After i requests at one instant: 10−i tokens; full again after
		// i seconds (one token per second).
		checkStatuses(t, fmt.Sprint("request ", i), e.call(t, req("api", ds...)), OK,
			st(OK, free, uint32(10-i), time.Duration(i)*time.Second))
	}
	resp := e.call(t, req("api", ds...))
	checkStatuses(t, "request 11", resp, OVER, st(OVER, free, 0, 10*time.Second))
	if got := problem(t, resp)["violated-policies"]; !cmp.Equal(got, []any{"free"}) {
		t.Errorf("violated-policies %v, want [free]", got)
	}
	if h := headers(t, resp); h["Retry-After"] != "1" {
		t.Errorf("Retry-After %q, want 1 (next token)", h["Retry-After"])
	}
	e.clock.Advance(time.Second)
	checkStatuses(t, "one second later", e.call(t, req("api", ds...)), OK, st(OK, free, 0, 10*time.Second))
}

// TestPlanExemptCredential: the exempt credential is unlimited in every
// tier and on every route class, however many requests it sends; nothing is
// counted and no headers are sent.
func TestPlanExemptCredential(t *testing.T) {
	e := plansEnv(t)
	for _, tier := range []string{"free", "pro", "enterprise", "internal"} {
		for _, path := range []string{"/v1/search", "/v1/reports", "/v1/ai", "/healthz"} {
			ds := envoyDescriptors(t, envoyRequest{path: path, plan: tier, apiKey: "k8s-readiness-probe"})
			want := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))
			for i := range want {
				want[i] = st(OK, nil, math.MaxUint32, 0)
			}
			// Far above every limit of the tier (free reports: 10/min).
			for i := 0; i < 150; i++ {
				resp := e.call(t, req("api", ds...))
				if resp.GetOverallCode() != OK {
					checkStatuses(t, fmt.Sprintf("%s %s request %d", tier, path, i+1), resp, OK, want...)
					t.FailNow()
				}
				if i == 149 {
					checkStatuses(t, tier+" "+path, resp, OK, want...)
					if h := headers(t, resp); len(h) != 0 {
						t.Errorf("%s %s: headers %v", tier, path, h)
					}
				}
			}
		}
	}
	if n := e.store.Calls(); n != 0 {
		t.Errorf("store called %d times for an exempt credential", n)
	}
	// A non-exempt key of the same tier is limited.
	ds := envoyDescriptors(t, envoyRequest{path: "/v1/reports", plan: "free", apiKey: "k8s-readiness-probe-2"})
	for i := 0; i < 10; i++ {
		e.call(t, req("api", ds...))
	}
	if resp := e.call(t, req("api", ds...)); resp.GetOverallCode() != OVER {
		t.Errorf("non-exempt key: 11th report allowed: %v", resp.GetStatuses())
	}
}

// TestPlanAnonymousPerIP: requests without an API key are limited per
// client address by the anonymous layer (token bucket, 30 per minute =
// one token per 2 s, capacity 20), named "anonymous".
func TestPlanAnonymousPerIP(t *testing.T) {
	e := plansEnv(t)
	anon := limit("anonymous", 30, minute)
	a := envoyDescriptors(t, envoyRequest{path: "/v1/search?q=x", client: "198.51.100.7"})
	for i := 1; i <= 20; i++ {
		// full again after i × 2 s
		checkStatuses(t, fmt.Sprint("request ", i), e.call(t, req("api", a...)), OK,
			st(OK, anon, uint32(20-i), time.Duration(2*i)*time.Second))
	}
	resp := e.call(t, req("api", a...))
	checkStatuses(t, "request 21", resp, OVER, st(OVER, anon, 0, 40*time.Second))
	h := headers(t, resp)
	if diff := cmp.Diff([]sfItem{q("anonymous", 30, 60)}, parseList(t, h["RateLimit-Policy"])); diff != "" {
		t.Errorf("RateLimit-Policy (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]sfItem{r("anonymous", 0, 2)}, parseList(t, h["RateLimit"])); diff != "" {
		t.Errorf("RateLimit (-want +got):\n%s", diff)
	}
	if got := problem(t, resp)["violated-policies"]; !cmp.Equal(got, []any{"anonymous"}) {
		t.Errorf("violated-policies %v, want [anonymous]", got)
	}
	// Another address has its own bucket, on any path.
	b := envoyDescriptors(t, envoyRequest{path: "/", client: "198.51.100.8"})
	checkStatuses(t, "other IP", e.call(t, req("api", b...)), OK, st(OK, anon, 19, 2*time.Second))
	// The same address with an API key is counted by its plan, not per IP.
	k := envoyDescriptors(t, envoyRequest{path: "/v1/users/me", plan: "free", apiKey: "k1", client: "198.51.100.7"})
	checkStatuses(t, "keyed", e.call(t, req("api", k...)), OK, st(OK, limit("free", 60, minute), 9, time.Second))
}
