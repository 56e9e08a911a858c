package service_test

import (
	"path/filepath"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

const overrideYAML = `domain: ov
override: {failure_mode: closed}
descriptors:
  - key: lower
    override: {mode: lower_only}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: capped
    override: {max: {requests_per_unit: 3, unit: hour}}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: deny
    override: {mode: deny}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 5, failure_mode: closed}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 5}
`

const referenceYAML = `domain: ref
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 5, failure_mode: closed}
`

// overrideEnv is newEnv with the override test config (domains ov, ref).
func overrideEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ov.yaml"), overrideYAML)
	writeFile(t, filepath.Join(dir, "ref.yaml"), referenceYAML)
	e := newEnv(t, nil)
	e.svc.SetPolicy(loadSet(t, dir))
	return e
}

func overrideDesc(key string, rpu uint32, unit typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
	x := d(key, "u")
	x.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return x
}

// admitted sends n requests and counts the OK answers.
func admitted(t *testing.T, e *env, n int, r func() *rlsv3.RateLimitRequest) int {
	t.Helper()
	ok := 0
	for range n {
		if e.call(t, r()).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// TestOverrideCaps: a 4294967295/second override on 5/hour rules admits
// what each rule's override policy allows, on a fixed clock.
func TestOverrideCaps(t *testing.T) {
	huge := func(domain, key string) func() *rlsv3.RateLimitRequest {
		return func() *rlsv3.RateLimitRequest {
			return req(domain, overrideDesc(key, 4294967295, typev3.RateLimitUnit_SECOND))
		}
	}
	for _, c := range []struct {
		domain, key string
		want        int
	}{
		{"ov", "lower", 5},  // lower_only: the configured 5/hour still applies
		{"ov", "capped", 3}, // clamped to max 3/hour
		{"ov", "deny", 5},   // ignored: the configured 5/hour
		{"ov", "plain", 20}, // allow (default): as sent, as envoyproxy/ratelimit
		{"ref", "plain", 20},
	} {
		e := overrideEnv(t)
		if got := admitted(t, e, 20, huge(c.domain, c.key)); got != c.want {
			t.Errorf("%s/%s: %d of 20 admitted, want %d", c.domain, c.key, got, c.want)
		}
	}

	// lower_only and deny count on the rule's own counter: requests
	// without an override see it spent.
	e := overrideEnv(t)
	for _, key := range []string{"lower", "deny"} {
		if got := admitted(t, e, 3, huge("ov", key)); got != 3 {
			t.Fatalf("%s: %d of 3 admitted", key, got)
		}
		if got := admitted(t, e, 5, func() *rlsv3.RateLimitRequest { return req("ov", d(key, "u")) }); got != 2 {
			t.Errorf("%s: %d of 5 admitted without override after 3 with, want 2", key, got)
		}
	}
	// lower_only: a lower override is enforced on top of the rule.
	low := func() *rlsv3.RateLimitRequest {
		return req("ov", overrideDesc("lower", 2, typev3.RateLimitUnit_HOUR))
	}
	e = overrideEnv(t)
	if got := admitted(t, e, 10, low); got != 2 {
		t.Errorf("lower_only 2/hour: %d of 10 admitted, want 2", got)
	}
	// Without a rule (and no override policy), an override applies as sent.
	e = overrideEnv(t)
	if got := admitted(t, e, 10, func() *rlsv3.RateLimitRequest {
		return req("ref", overrideDesc("norule", 3, typev3.RateLimitUnit_HOUR))
	}); got != 3 {
		t.Errorf("ref/norule 3/hour: %d of 10 admitted, want 3", got)
	}
}

// TestOverrideKeepsFailureMode: with the store failing, an override on a
// failure_mode: closed rule is denied, and an override matching no rule
// gets the domain's override failure_mode (default open).
func TestOverrideKeepsFailureMode(t *testing.T) {
	for _, c := range []struct {
		domain, key string
		want        rlsv3.RateLimitResponse_Code
	}{
		{"ov", "closed", rlsv3.RateLimitResponse_OVER_LIMIT},
		{"ref", "plain", rlsv3.RateLimitResponse_OVER_LIMIT},
		{"ov", "norule", rlsv3.RateLimitResponse_OVER_LIMIT}, // domain override failure_mode: closed
		{"ref", "norule", rlsv3.RateLimitResponse_OK},        // default: open
		{"ov", "plain", rlsv3.RateLimitResponse_OK},          // the rule's failure_mode: open
	} {
		e := overrideEnv(t)
		e.store.fail(errDown)
		r := req(c.domain, overrideDesc(c.key, 4294967295, typev3.RateLimitUnit_SECOND))
		if got := e.call(t, r).GetOverallCode(); got != c.want {
			t.Errorf("%s/%s with the store down: %s, want %s", c.domain, c.key, got, c.want)
		}
	}
}
