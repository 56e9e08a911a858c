package policy

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/golden"
)

// errorCorpus holds configs with problems in every part of a file: the
// document, descriptors, limits, per-rule options, overrides and plans.
var errorCorpus = []struct{ name, yaml string }{
	{"empty", ""},
	{"two documents", "domain: d\n---\ndomain: e\n"},
	{"not a mapping", "- a\n"},
	{"no domain", "descriptors: []\n"},
	{"unknown top keys", "domain: d\ndescriptor: []\ndomians: x\n"},
	{"descriptors not a list", "domain: d\ndescriptors: {key: a}\n"},
	{"descriptor problems", "domain: d\ndescriptors:\n  - value: v\n  - key: ''\n  - key: ratelimitd.release\n  - 5\n  - key: a\n    ratelimit: {}\n    shadowmode: true\n    unit: second\n"},
	{"bools", "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes please\n    quota_mode: [1]\n    detailed_metric: 3\n    value_to_metric: x\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
	{"rate_limit null and list", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n  - key: b\n    rate_limits: []\n  - key: c\n    rate_limits: {unit: second}\n"},
	{"rate_limit and rate_limits", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits:\n      - {unit: minute, requests_per_unit: 2}\n"},
	{"duplicate limit names", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {name: x, unit: second, requests_per_unit: 1}\n      - {name: x, unit: minute, requests_per_unit: 1}\n"},
	{"unlimited in rate_limits", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unlimited: true}\n      - 7\n"},
	{"units", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: c\n    rate_limit: {unit: [x], requests_per_unit: 1}\n"},
	{"unlimited with fields", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second, algorithm: token_bucket, burst: 3}\n  - key: b\n    rate_limit: {unlimited: true, unit: bogus}\n"},
	{"integers", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 99999999999999999999}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n  - key: d\n    rate_limit: {unit: second, requests_per_unit: x}\n  - key: e\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n"},
	{"algorithm and failure_mode", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky, failure_mode: maybe}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: [x], failure_mode: {}}\n"},
	{"extension bounds", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 100000000, algorithm: sliding_log}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 100000000, algorithm: concurrency}\n  - key: d\n    rate_limit: {unit: day, requests_per_unit: 1, calendar: true, algorithm: token_bucket}\n  - key: e\n    rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 200}\n"},
	{"store", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1, store: durable}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 1, store: disk}\n  - key: c\n    rate_limit: {unlimited: true, store: fast}\n"},
	{"replaces", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: x\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: x}, {name: ''}, {nme: y}, 3]\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: x}\n"},
	{"counting", "domain: d\ndescriptors:\n  - key: a\n    counting: sometimes\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    counting: always_charge\n  - key: c\n    counting: [x]\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
	{"override", "domain: d\noverride: {mode: maybe, max: {requests_per_unit: 1}, failure_mode: sometimes, extra: 1}\ndescriptors:\n  - key: a\n    override: {mode: deny, max: {requests_per_unit: 1, unit: second}, failure_mode: open}\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    override: {mode: allow}\n  - key: c\n    override: 5\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: e\n    override: {max: {requests_per_unit: 1, unit: fortnight, x: 1}}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
	{"metadata", "domain: d\ndescriptors:\n  - key: a\n    metadata: [1, 2]\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    metadata: {a: {b: [1, 2.5, true, null, x]}, 3: y}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
	{"rate_limit unknown keys", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, requestsperunit: 2, algo: x, shadow_mode: true, unitmultiplier: 1, nam: q}\n"},
	{"plans problems", "domain: d\nplans:\n  plan: p\n  tiers: {}\n"},
	{"plans", "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n  route_key: r\n  tiers:\n    free: {requests_per_unit: 1, unit: second}\n    max: {unlimited: true}\n    '': {unit: second}\n    bad: 5\n  routes:\n    a: {requests_per_unit: 2, unit: second}\n    b:\n      rate_limit: {requests_per_unit: 3, unit: fortnight}\n      tiers: {free: {requests_per_unit: 4, unit: second}, gold: {requests_per_unit: 1, unit: second}, max: {requests_per_unit: 1, unit: second}}\n      extra: 1\n    c: 7\n    d: {tiers: 5}\n  exempt:\n    - {credential: k}\n    - {reason: r}\n    - {credential: ok, reason: fine, other: 1}\n    - 9\n  anonymous: {key: remote_address}\n"},
	{"plans shapes", "domain: d\nplans:\n  plan_key: p\n  credential_key: c\n  tiers: {free: {requests_per_unit: 1, unit: second}}\n  routes: {a: {requests_per_unit: 1, unit: second}}\n  exempt: {credential: x}\n  anonymous: 5\n"},
	{"merge keys", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &x {<<: *x, unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {<<: [1], unit: second, requests_per_unit: 1}\n"},
	{"non-string key", "domain: d\n1: x\ndescriptors:\n  - key: a\n    [x]: 1\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
	{"duplicate keys", "domain: d\ndomain: e\ndescriptors:\n  - key: a\n    key: b\n"},
	{"yaml syntax", "domain: d\ndescriptors:\n  - key: [a\n"},
}

// TestParseErrorsGolden pins every error and warning Load reports for
// errorCorpus: messages, lines and order.
func TestParseErrorsGolden(t *testing.T) {
	var b strings.Builder
	for _, c := range errorCorpus {
		_, warns, errs := loadOne(t, c.yaml)
		fmt.Fprintf(&b, "== %s\n", c.name)
		for _, e := range errs {
			fmt.Fprintf(&b, "%s\n", e)
		}
		for _, w := range warns {
			fmt.Fprintf(&b, "%s\n", w)
		}
	}
	got := b.String()
	golden.Check(t, filepath.Join("testdata", "errors.golden"), []byte(got))
}
