package service_test

import (
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// negative marks a descriptor as a refund (is_negative_hits).
func negative(x *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	x.IsNegativeHits = true
	return x
}

// TestRefundNeverDenied: a refund is never OVER_LIMIT: not on an exhausted
// limit, not with a failing backend under failure_mode: closed (it is then
// answered OK without being applied, and not counted as a refund), and a
// refund in a request that another descriptor denies is still applied.
func TestRefundNeverDenied(t *testing.T) {
	e := newEnv(t, nil)
	if r := e.call(t, req("svc", withHits(d("small", "u"), 2))); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("take 2: %v", r)
	}
	r := e.call(t, req("svc", negative(withHits(d("small", "u"), 1)), withHits(d("small", "v"), 3)))
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || r.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Fatalf("refund next to a denied descriptor: %v", r)
	}
	if r := e.call(t, req("svc", withHits(d("small", "u"), 0))); r.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Errorf("the refund in a denied request was not kept: %v", r)
	}
	if got := metricValue(t, e.reg, "ratelimitd_refunds_total", map[string]string{"domain": "svc"}); got != 1 {
		t.Errorf("ratelimitd_refunds_total %v, want 1", got)
	}
	if got := metricValue(t, e.reg, "ratelimitd_refund_units_total", map[string]string{"domain": "svc"}); got != 1 {
		t.Errorf("ratelimitd_refund_units_total %v, want 1", got)
	}

	e.store.fail(errDown)
	r = e.call(t, req("svc", negative(withHits(d("closed", "u"), 1))))
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("refund under failure_mode closed with the backend down: %v", r)
	}
	if got := metricValue(t, e.reg, "ratelimitd_refunds_total", map[string]string{"domain": "svc"}); got != 1 {
		t.Errorf("ratelimitd_refunds_total %v after a refund the backend did not apply, want 1", got)
	}
}
