package service_test

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// TestQuotaModeReferenceAnswers: in reference mode quota_mode never denies:
// with every quota descriptor over, the request is OK and each over-limit
// quota descriptor is OK with its limit, no remaining and no
// duration_until_reset, as the pinned envoyproxy/ratelimit answers. A
// non-quota descriptor over its limit still denies.
func TestQuotaModeReferenceAnswers(t *testing.T) {
	lim := limit("", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	e := newEnv(t, func(o *service.Options) { o.ReferenceAnswers = true })
	both := func() *rlsv3.RateLimitRequest { return req("svc", d("quota_a", "x"), d("quota_b", "x")) }
	checkStatuses(t, "first", e.call(t, both()), OK, st(OK, lim, 0, 30*time.Second), st(OK, lim, 0, 30*time.Second))
	over := &rlsv3.RateLimitResponse_DescriptorStatus{Code: OK, CurrentLimit: lim}
	checkStatuses(t, "all over", e.call(t, both()), OK, over, over)

	u := limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	for range 10 {
		e.call(t, req("svc", d("user", "u")))
	}
	checkStatuses(t, "non-quota over", e.call(t, req("svc", d("quota_a", "x"), d("user", "u"))), OVER, over, st(OVER, u, 0, 30*time.Second))
}
