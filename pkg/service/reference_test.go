package service_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// referenceOptions are the service options cmd/ratelimitd sets in
// reference mode with LIMIT_RESPONSE_HEADERS_ENABLED=true and the
// reference's default header names.
func referenceOptions(o *service.Options) {
	o.Headers = service.HeadersLegacy
	o.LegacyHeaderNames = service.LegacyHeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
	o.OmitProblem = true
	o.ReferenceAnswers = true
}

func TestLegacyHeaderNames(t *testing.T) {
	e := newEnv(t, referenceOptions)
	h := headers(t, e.call(t, req("svc", d("multi", "m"), d("user", "u"))))
	want := map[string]string{"RateLimit-Limit": "3", "RateLimit-Remaining": "2", "RateLimit-Reset": "10"}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
}

// With OmitProblem a denial carries the legacy headers only: no
// Retry-After, no Content-Type, no raw_body.
func TestOmitProblem(t *testing.T) {
	e := newEnv(t, referenceOptions)
	e.call(t, req("svc", d("small", "s")))
	e.call(t, req("svc", d("small", "s")))
	resp := e.call(t, req("svc", d("small", "s")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third call: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if len(resp.GetRawBody()) != 0 {
		t.Errorf("raw_body %q, want none", resp.GetRawBody())
	}
	want := map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": "30"}
	if diff := cmp.Diff(want, headers(t, resp)); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}

	// The default still sends the problem.
	e = newEnv(t, nil)
	for range 2 {
		e.call(t, req("svc", d("small", "s")))
	}
	resp = e.call(t, req("svc", d("small", "s")))
	if len(resp.GetRawBody()) == 0 || headers(t, resp)["Retry-After"] == "" {
		t.Errorf("default options: denial without problem body or Retry-After: %v", resp)
	}
}

// A denied quota descriptor does not take the legacy headers from the
// least-remaining choice: only a non-shadow, non-quota denial overrides
// it, as envoyproxy/ratelimit picks.
func TestLegacyHeadersQuotaDenialDoesNotOverride(t *testing.T) {
	e := newEnv(t, referenceOptions)
	e.call(t, req("svc", d("quota_a", "x")))
	for range 4 {
		e.call(t, req("svc", d("quota_c", "x")))
	}
	// quota_c reaches 0 left (allowed), quota_a is over, quota_b has 0
	// left: not every quota descriptor is over, so the request passes.
	// The first with the least remaining is quota_c (5 per minute).
	resp := e.call(t, req("svc", d("quota_c", "x"), d("quota_a", "x"), d("quota_b", "x")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("overall %v, want OK", resp.GetOverallCode())
	}
	want := map[string]string{"RateLimit-Limit": "5", "RateLimit-Remaining": "0", "RateLimit-Reset": "30"}
	if diff := cmp.Diff(want, headers(t, resp)); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
}

func TestReferenceAnswers(t *testing.T) {
	e := newEnv(t, referenceOptions)
	// A descriptor with no entries, one with an empty key: matched by
	// nothing, answered OK without a limit, next to a counted one.
	resp := e.call(t, req("svc", &rlcommon.RateLimitDescriptor{}, d("", "v"), d("user", "u")))
	want := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK},
			{Code: rlsv3.RateLimitResponse_OK},
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, LimitRemaining: 9},
		},
	}
	if diff := cmp.Diff(want, resp, protocmp.Transform(),
		protocmp.IgnoreFields(&rlsv3.RateLimitResponse_DescriptorStatus{}, "duration_until_reset"),
		protocmp.IgnoreFields(&rlsv3.RateLimitResponse{}, "response_headers_to_add")); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name string
		r    *rlsv3.RateLimitRequest
		msg  string
	}{
		{"empty domain", req("", d("user", "u")), "rate limit domain must not be empty"},
		{"no descriptors", req("svc"), "rate limit descriptor list must not be empty"},
	} {
		_, err := e.client.ShouldRateLimit(context.Background(), tc.r)
		if st, _ := status.FromError(err); st.Code() != codes.Unknown || st.Message() != tc.msg {
			t.Errorf("%s: %v, want Unknown %q", tc.name, err, tc.msg)
		}
	}

	// Without ReferenceAnswers the same descriptors are InvalidArgument.
	strict := newEnv(t, nil)
	for _, x := range []*rlcommon.RateLimitDescriptor{{}, d("", "v")} {
		_, err := strict.client.ShouldRateLimit(context.Background(), req("svc", x))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("strict %v: %v, want InvalidArgument", x, err)
		}
	}
}

// A request denied with some quota left (hits_addend above what is
// left): ratelimitd reports what is left, the reference 0.
func TestReferenceDeniedRemaining(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mutate    func(*service.Options)
		remaining uint32
		header    string
	}{
		{"native", func(o *service.Options) { o.Headers = service.HeadersLegacy }, 2, "2"},
		{"reference", referenceOptions, 0, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.mutate)
			resp := e.call(t, req("svc", withHits(d("small", "s"), 3)))
			st := resp.GetStatuses()[0]
			if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != tc.remaining {
				t.Errorf("status %v, want OVER_LIMIT with %d remaining", st, tc.remaining)
			}
			h := headers(t, resp)
			name := "X-RateLimit-Remaining"
			if tc.name == "reference" {
				name = "RateLimit-Remaining"
			}
			if h[name] != tc.header {
				t.Errorf("%s = %q, want %q (%v)", name, h[name], tc.header, h)
			}
		})
	}
}

// /json answers a request the reference refuses with 400, as it does.
func TestReferenceJSONRefused(t *testing.T) {
	e := newEnv(t, referenceOptions)
	rec := httptest.NewRecorder()
	e.svc.JSONHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain":"","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}`)))
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "rate limit domain must not be empty") {
		t.Errorf("/json empty domain: %d %q, want 400", rec.Code, rec.Body.String())
	}
}

// Before the first config: the reference's error.
func TestReferenceNoConfig(t *testing.T) {
	for _, tc := range []struct {
		ref  bool
		code codes.Code
		msg  string
	}{{false, codes.Unavailable, "service: no rate limit configuration loaded"}, {true, codes.Unknown, "no rate limit configuration loaded"}} {
		svc, err := service.New(service.Options{Store: newReferenceStore(&clock{now: t0}), ReferenceAnswers: tc.ref})
		if err != nil {
			t.Fatal(err)
		}
		_, err = svc.ShouldRateLimit(context.Background(), req("svc", d("user", "u")))
		if st, _ := status.FromError(err); st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("ReferenceAnswers=%v: %v, want %v %q", tc.ref, err, tc.code, tc.msg)
		}
	}
}
