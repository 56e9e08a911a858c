package refdiff

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// modesConfig has a quota_mode descriptor and descriptor values with a
// '*' that is not only at the end, which the pinned reference treats as
// literal text (only a trailing '*' is a prefix wildcard).
const modesConfig = `domain: refdiff_modes
descriptors:
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: mid
    value: "bar*b"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: multi
    value: "foo*bar*baz*"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tail
    value: "pre*"
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// TestDifferentialQuotaAndWildcards: in reference mode quota_mode never
// denies the request (overall OK, the descriptor status OVER_LIMIT), and
// a '*' matches as the pinned reference's: only a trailing '*' is a
// prefix wildcard, every other '*' is literal.
func TestDifferentialQuotaAndWildcards(t *testing.T) {
	p := startPair(t, nil, map[string]string{"refdiff_modes.yaml": modesConfig})
	const dom = "refdiff_modes"
	for _, sc := range []scenario{
		{name: "quota_mode over its limit", limited: true, reachesOver: false, steps: func() []step {
			v := unique("q")
			return repeat(3, "quota", func() *rlsv3.RateLimitRequest { return req(dom, d("quota", v)) })
		}()},
		{name: "quota_mode beside an enforced descriptor", limited: true, reachesOver: true, steps: func() []step {
			v, w := unique("q"), unique("t")
			return repeat(3, "quota and tail", func() *rlsv3.RateLimitRequest { return req(dom, d("quota", v), d("tail", "pre"+w)) })
		}()},
		{name: "a '*' inside a value is literal", limited: true, reachesOver: true, steps: steps(
			repeat(2, "barXb", func() *rlsv3.RateLimitRequest { return req(dom, d("mid", "barXb")) }),
			repeat(2, "bar*b", func() *rlsv3.RateLimitRequest { return req(dom, d("mid", "bar*b")) }),
		)},
		{name: "several '*': the text before the last is a literal prefix", limited: true, reachesOver: true, steps: steps(
			repeat(2, "fooXbarYbazZ", func() *rlsv3.RateLimitRequest { return req(dom, d("multi", "fooXbarYbazZ")) }),
			repeat(2, "foo*bar*bazZ", func() *rlsv3.RateLimitRequest { return req(dom, d("multi", "foo*bar*bazZ")) }),
		)},
	} {
		t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
	}
}
