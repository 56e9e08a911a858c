package service_test

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestConfiguredDomainNamedUnknown: a configured domain literally named
// "_unknown" is decided by its rules and not counted as an unknown domain.
func TestConfiguredDomainNamedUnknown(t *testing.T) {
	e := newEnv(t, nil)
	e.svc.SetPolicy(loadSet(t, "testdata/unknown.yaml"))
	req := &rlsv3.RateLimitRequest{Domain: "_unknown", Descriptors: []*corev3.RateLimitDescriptor{{
		Entries: []*corev3.RateLimitDescriptor_Entry{{Key: "user", Value: "a"}},
	}}}
	for range 6 {
		if _, err := e.svc.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	if got := metricValue(t, e.reg, "ratelimitd_unknown_domain_requests_total", nil); got != 0 {
		t.Errorf("unknown-domain requests = %v, want 0", got)
	}
	if got := metricValue(t, e.reg, "ratelimitd_requests_total", map[string]string{"domain": "_unknown", "code": "over_limit"}); got != 1 {
		t.Errorf("over-limit requests = %v, want 1 (limit 5 of 6)", got)
	}
}
