package service_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

const saturationConfig = `
domain: shed
descriptors:
  - key: route
    reserve: {entry: priority, value: critical, share: 0.8, saturated_share: 0.5}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plain
    reserve: {entry: priority, value: critical, share: 0.8}
    rate_limit: {unit: minute, requests_per_unit: 10}
`

func saturationService(t *testing.T) (*service.Service, *clock) {
	t.Helper()
	c := &clock{now: t0}
	svc := newService(t, testOptions(c, newMemoryStore(t, c), prometheus.NewRegistry()), nil)
	set, _, err := policy.LoadSources(policy.LoadOptions{}, policy.Source{Name: "shed.yaml", Data: []byte(saturationConfig)})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(set)
	return svc, c
}

func routeRequest(route, priority string) *rlsv3.RateLimitRequest {
	d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "route", Value: route}}}
	if priority != "" {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "priority", Value: priority})
	}
	return &rlsv3.RateLimitRequest{Domain: "shed", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
}

// countAdmitted sends n requests and counts OK answers; it returns the
// RateLimit-Policy header of the first answer.
func countAdmitted(t *testing.T, svc *service.Service, n int, r *rlsv3.RateLimitRequest) (int, string) {
	t.Helper()
	ok, pol := 0, ""
	for i := range n {
		resp, err := svc.ShouldRateLimit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
		if i == 0 {
			for _, h := range resp.GetResponseHeadersToAdd() {
				if h.GetKey() == "RateLimit-Policy" {
					pol = h.GetValue()
				}
			}
		}
	}
	return ok, pol
}

// TestSaturationAdminLowersShare: while the admin API marks the rule
// saturated, other requests stop at floor(0.5 × 10) and see q=5; critical
// ones still reach 10; the mark ends on its own and can be cleared.
func TestSaturationAdminLowersShare(t *testing.T) {
	svc, c := saturationService(t)
	h := svc.AdminHandler()
	post := func(body string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, service.AdminSaturationPath, strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	code, body := post(`{"domain":"shed","rule":"shed.route","for":"30s"}`)
	if code != http.StatusOK || !strings.Contains(body, `"saturated_until": "2026-01-01T00:01:00Z"`) {
		t.Fatalf("set: %d %s", code, body)
	}
	ok, pol := countAdmitted(t, svc, 12, routeRequest("/a", "low"))
	if ok != 5 || !strings.Contains(pol, ";q=5;") {
		t.Errorf("saturated: %d other admitted, policy %q; want 5, q=5", ok, pol)
	}
	if ok, _ := countAdmitted(t, svc, 12, routeRequest("/a", "critical")); ok != 5 {
		t.Errorf("saturated: %d critical admitted after 5 others, want 5 (up to 10)", ok)
	}

	// The mark ends after 30 s; a new window, the share is 8 again.
	c.Advance(time.Minute)
	ok, pol = countAdmitted(t, svc, 12, routeRequest("/b", ""))
	if ok != 8 || !strings.Contains(pol, ";q=8;") {
		t.Errorf("after the mark: %d admitted, policy %q; want 8, q=8", ok, pol)
	}

	// Cleared explicitly.
	if code, body := post(`{"domain":"shed","rule":"shed.route","for":"10m"}`); code != http.StatusOK {
		t.Fatalf("set: %d %s", code, body)
	}
	if ok, _ := countAdmitted(t, svc, 12, routeRequest("/c", "")); ok != 5 {
		t.Errorf("marked again: %d admitted, want 5", ok)
	}
	if code, body := post(`{"domain":"shed","rule":"shed.route","for":"0s"}`); code != http.StatusOK || !strings.Contains(body, `"saturated_until": ""`) {
		t.Fatalf("clear: %d %s", code, body)
	}
	if ok, _ := countAdmitted(t, svc, 12, routeRequest("/d", "")); ok != 8 {
		t.Errorf("cleared: %d admitted, want 8", ok)
	}

	for _, c := range []struct {
		body string
		code int
	}{
		{`{"domain":"shed","rule":"shed.plain","for":"30s"}`, http.StatusBadRequest}, // no saturated_share
		{`{"domain":"shed","rule":"shed.nope","for":"30s"}`, http.StatusNotFound},
		{`{"domain":"nope","rule":"shed.route","for":"30s"}`, http.StatusNotFound},
		{`{"domain":"shed","rule":"shed.route","for":"soon"}`, http.StatusBadRequest},
		{`{"domain":"shed","rule":"shed.route","for":"30s","x":1}`, http.StatusBadRequest},
	} {
		if code, body := post(c.body); code != c.code {
			t.Errorf("%s: %d %s, want %d", c.body, code, body, c.code)
		}
	}
}

// TestSaturationBounded: a mark lasts at most service.MaxSaturation.
func TestSaturationBounded(t *testing.T) {
	svc, c := saturationService(t)
	until, err := svc.SetSaturation("shed", "shed.route", 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := c.Now().Add(service.MaxSaturation); !until.Equal(want) {
		t.Errorf("until %v, want %v", until, want)
	}
}
