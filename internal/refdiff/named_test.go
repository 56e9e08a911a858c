package refdiff

import (
	"fmt"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Documented differences of counting (docs/migrating.md, "Reference
// mode"). In both, ratelimitd admits less than the pinned reference, never
// more: the steps named here assert exactly the documented answers of both
// servers, every other step of the same sequences is compared as usual.

// codes checks the overall code and the code of status i of both answers.
func codes(ref, ours answer, i int, wantRef, wantOurs rlsv3.RateLimitResponse_Code) string {
	if ref.err != nil || ours.err != nil {
		return fmt.Sprintf("errors: reference %v, ratelimitd %v", ref.err, ours.err)
	}
	if g := ref.resp.GetOverallCode(); g != wantRef {
		return fmt.Sprintf("reference overall %v, documented %v", g, wantRef)
	}
	if g := ours.resp.GetOverallCode(); g != wantOurs {
		return fmt.Sprintf("ratelimitd overall %v, documented %v", g, wantOurs)
	}
	if len(ref.resp.GetStatuses()) <= i || len(ours.resp.GetStatuses()) <= i {
		return "missing statuses"
	}
	if g := ref.resp.GetStatuses()[i].GetCode(); g != wantRef {
		return fmt.Sprintf("reference status %d %v, documented %v", i, g, wantRef)
	}
	if g := ours.resp.GetStatuses()[i].GetCode(); g != wantOurs {
		return fmt.Sprintf("ratelimitd status %d %v, documented %v", i, g, wantOurs)
	}
	return ""
}

// checkAtLimit is the documented difference "a check-only descriptor
// (hits_addend 0) on a counter exactly at its limit": the reference
// answers OK (the counter does not exceed the limit), ratelimitd
// OVER_LIMIT (not one more unit would pass; Envoy Gateway's request-time
// check of a post-paid cost then stops a client that spent its whole
// quota, where the reference lets one more request through).
var checkAtLimit = namedStep{
	why: "check-only descriptor at exactly its limit: reference OK, ratelimitd OVER_LIMIT",
	check: func(ref, ours answer) string {
		return codes(ref, ours, 0, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT)
	},
}

// zeroHitsScenario: 20 hits fill a 20/minute counter, then a check-only
// request (documented difference), one hit (over on both), and a
// check-only request over the limit (over on both).
func zeroHitsScenario() scenario {
	v := unique("z")
	return scenario{name: "zero hits at exactly the limit", limited: true, reachesOver: true,
		named: map[int]namedStep{1: checkAtLimit},
		steps: steps(
			one("20 hits", reqHits(20, "another", d("key4", v))),
			one("0 hits at the limit", req("another", hits(d("key4", v), 0))),
			one("1 hit: over", req("another", d("key4", v))),
			one("0 hits over the limit", req("another", hits(d("key4", v), 0))),
		)}
}

// TestDifferentialZeroHitsAtTheLimit: the check-only case, with the
// reference's default counting.
func TestDifferentialZeroHitsAtTheLimit(t *testing.T) {
	p := startPair(t, []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true"}, map[string]string{"refdiff.yaml": refdiffConfig})
	p.run(t, zeroHitsScenario())
}

// TestDifferentialStopIncrementWhenOverLimit: the counting sequences with
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true, which reference mode maps
// to all_or_nothing (a denied request consumes nothing, decided
// atomically). The reference, which reads the counters before it
// increments them, still charges the request that goes over a limit and
// stops charging when a shadow-mode limit goes over; both differences are
// named below.
func TestDifferentialStopIncrementWhenOverLimit(t *testing.T) {
	p := startPair(t, []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}, map[string]string{"refdiff.yaml": refdiffConfig})
	overshootCharged := namedStep{
		why: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: the reference charges the request that goes over; all_or_nothing does not, so the next 2 hits fit",
		check: func(ref, ours answer) string {
			return codes(ref, ours, 0, rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OK)
		},
	}
	shadowStopsCharging := namedStep{
		why: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a shadow limit over the limit stops the reference charging the counted one; ratelimitd counts it",
		check: func(ref, ours answer) string {
			if ref.err != nil || ours.err != nil || len(ref.resp.GetStatuses()) < 2 || len(ours.resp.GetStatuses()) < 2 {
				return fmt.Sprintf("errors or statuses missing: %v %v", ref.err, ours.err)
			}
			if r, o := ref.resp.GetStatuses()[1].GetLimitRemaining(), ours.resp.GetStatuses()[1].GetLimitRemaining(); r != o+1 {
				return fmt.Sprintf("counted limit remaining: reference %d, ratelimitd %d; documented: one less on ratelimitd", r, o)
			}
			return ""
		},
	}
	for _, sc := range countingScenarios() {
		switch sc.name {
		case "hits_addend over the limit, then fewer":
			sc.named = map[int]namedStep{2: overshootCharged}
		case "shadow limit over, next to a counted one":
			sc.named = map[int]namedStep{2: shadowStopsCharging, 3: {
				why: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: the reference admits a request over the counted limit after a shadow limit went over",
				check: func(ref, ours answer) string {
					return codes(ref, ours, 1, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT)
				},
			}}
		}
		t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
	}
	t.Run("zero hits at exactly the limit", func(t *testing.T) { p.run(t, zeroHitsScenario()) })
}
