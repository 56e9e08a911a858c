//go:build refcounting

// The sequences of this file give answers ratelimitd's reference mode
// does not reproduce yet; run them with
//
//	go test -tags refcounting ./internal/refdiff/
//
//   - A check-only descriptor (hits_addend 0) on a counter exactly at its
//     limit: the reference answers OK (the counter does not exceed the
//     limit), ratelimitd OVER_LIMIT (one more unit would not pass).
//   - STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true: the reference charges
//     only the limits that go over when one would (shadow-mode ones
//     included), which neither counting policy is: reference mode uses
//     all_or_nothing, which differs when a limit is asked for more than
//     it has left (the reference charges it anyway) and when a
//     shadow-mode limit goes over next to a counted one.

package refdiff

import "testing"

// pendingScenarios are the sequences of the cases above.
func pendingScenarios() []scenario {
	return []scenario{
		{name: "zero hits at exactly the limit", limited: true, reachesOver: true, steps: func() []step {
			// A check-only request (hits_addend 0) on a counter exactly
			// at its limit: the reference answers OK (the counter does
			// not exceed the limit), native ratelimitd answers
			// OVER_LIMIT (one more unit would not pass).
			v := unique("z")
			return steps(
				one("20 hits", reqHits(20, "another", d("key4", v))),
				one("0 hits at the limit", req("another", hits(d("key4", v), 0))),
				one("1 hit: over", req("another", d("key4", v))),
				one("0 hits over the limit", req("another", hits(d("key4", v), 0))),
			)
		}()},
	}
}

// TestDifferentialZeroHitsAtTheLimit: the check-only case, with the
// reference's default counting.
func TestDifferentialZeroHitsAtTheLimit(t *testing.T) {
	p := startPair(t, []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true"}, map[string]string{"refdiff.yaml": refdiffConfig})
	for _, sc := range pendingScenarios() {
		t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
	}
}

// TestDifferentialStopIncrementWhenOverLimit: the counting sequences with
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true.
func TestDifferentialStopIncrementWhenOverLimit(t *testing.T) {
	p := startPair(t, []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}, map[string]string{"refdiff.yaml": refdiffConfig})
	for _, sc := range append(countingScenarios(), pendingScenarios()...) {
		t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
	}
}
