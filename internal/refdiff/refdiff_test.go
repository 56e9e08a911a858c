package refdiff

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// refdiffConfig is this package's config, next to the reference's
// integration configs: the matching features those do not exercise
// (shadow_mode, unlimited, replaces, wildcard values, nested descriptors,
// value-only nodes without a limit, a zero limit). Every limit is per hour
// or longer, or per minute.
const refdiffConfig = `domain: refdiff
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: org
    value: acme
    descriptors:
      - key: user
        rate_limit: {name: acme_user, unit: hour, requests_per_unit: 3}
      - key: user
        value: vip
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tier
    value: gold
    descriptors:
      - key: user
        rate_limit:
          unit: hour
          requests_per_unit: 10
          replaces:
            - name: acme_user
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: path
    value: /api/exact
    rate_limit: {unit: hour, requests_per_unit: 6}
  - key: listed
    value: ok
  - key: listed
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: daily
    rate_limit: {name: daily, unit: day, requests_per_unit: 3}
  - key: block
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: level
    value: top
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: sub
        value: deep
        rate_limit: {unit: day, requests_per_unit: 25}
`

func unitOf(u string) typev3.RateLimitUnit {
	return typev3.RateLimitUnit(typev3.RateLimitUnit_value[strings.ToUpper(u)])
}

// scenarios are sequences whose answers do not depend on how the hits of
// a denied request are counted: every request that some limit denies has
// one descriptor with a counted limit (or several, where the others are
// unlimited or match nothing), and after a denial a counter is only hit
// again when it is exactly at its limit, where counting every hit and
// counting none of a denied request give the same answers. Modelled on
// the scenarios of the reference's integration tests.
func scenarios() []scenario {
	return []scenario{
		{name: "unknown domain", steps: steps(
			one("no config for the domain", req("foo", d("hello", "world"))),
			one("two descriptors", req("foo", d("hello", "world"), d("a", "b", "c", "d"))),
		)},
		{name: "per-second limit, fresh value", limited: true, steps: steps(
			one("key1", req("basic", d("key1", unique("foo")))),
			one("key1 other value", req("basic", d("key1", unique("foo")))),
		)},
		{name: "one per minute", limited: true, reachesOver: true, steps: repeat(3, "one_per_minute", func() *rlsv3.RateLimitRequest {
			return req("basic", d("one_per_minute", "x"))
		})},
		{name: "over a minute limit", limited: true, reachesOver: true, steps: func() []step {
			v := unique("key2")
			return repeat(25, "key2", func() *rlsv3.RateLimitRequest { return req("another", d("key2", v)) })
		}()},
		{name: "hour and day limits", limited: true, reachesOver: true, steps: func() []step {
			v := unique("v")
			return steps(
				repeat(11, "key3", func() *rlsv3.RateLimitRequest { return req("another", d("key3", v)) }),
				repeat(2, "key4", func() *rlsv3.RateLimitRequest { return req("another", d("key4", v)) }),
			)
		}()},
		{name: "request hits_addend", limited: true, reachesOver: true, steps: func() []step {
			v := unique("h")
			return steps(
				repeat(4, "5 hits", func() *rlsv3.RateLimitRequest { return reqHits(5, "another", d("key4", v)) }),
				one("5 more hits: over", reqHits(5, "another", d("key4", v))),
				one("1 hit at the limit", req("another", d("key4", v))),
			)
		}()},
		{name: "request hits_addend over what is left", limited: true, reachesOver: true, steps: func() []step {
			v := unique("h")
			return steps(
				one("18 hits", reqHits(18, "another", d("key4", v))),
				one("5 hits: over with 2 left", reqHits(5, "another", d("key4", v))),
			)
		}()},
		{name: "descriptor hits_addend", limited: true, reachesOver: true, steps: func() []step {
			v := unique("dh")
			return steps(
				one("0 hits on a fresh counter", req("another", hits(d("key4", v), 0))),
				one("0 hits", req("another", hits(d("key4", v), 0))),
				one("descriptor 20 beats request 3", reqHits(3, "another", hits(d("key4", v), 20))),
				one("1 hit at the limit", req("another", hits(d("key4", v), 1))),
				one("2 hits at the limit", req("another", hits(d("key4", v), 2))),
			)
		}()},
		{name: "share_threshold wildcard", limited: true, reachesOver: true, steps: steps(
			repeat(5, "files/a", func() *rlsv3.RateLimitRequest { return req("share-threshold-test", d("files", "files/a")) }),
			repeat(5, "files/b shares the counter", func() *rlsv3.RateLimitRequest { return req("share-threshold-test", d("files", "files/b")) }),
			one("files/c: over", req("share-threshold-test", d("files", "files/c"))),
			repeat(2, "files_no_share/a", func() *rlsv3.RateLimitRequest {
				return req("share-threshold-test", d("files_no_share", "files_no_share/a"))
			}),
			one("files_no_share/b: own counter", req("share-threshold-test", d("files_no_share", "files_no_share/b"))),
		)},
		{name: "shadow mode", limited: true, steps: func() []step {
			v := unique("s")
			return repeat(4, "shadow", func() *rlsv3.RateLimitRequest { return req("refdiff", d("shadow", v)) })
		}()},
		{name: "unlimited", steps: steps(
			repeat(2, "free", func() *rlsv3.RateLimitRequest { return req("refdiff", d("free", "x")) }),
			one("free and nothing", req("refdiff", d("free", "x"), d("nothing", "y"))),
		)},
		{name: "nested descriptors", limited: true, reachesOver: true, steps: func() []step {
			u := unique("u")
			return steps(
				repeat(4, "org acme, user", func() *rlsv3.RateLimitRequest { return req("refdiff", d("org", "acme", "user", u)) }),
				one("org acme, user vip: exact beats default", req("refdiff", d("org", "acme", "user", "vip"))),
				one("org acme alone: node without limit", req("refdiff", d("org", "acme"))),
				one("deeper than the config", req("refdiff", d("org", "acme", "user", u, "extra", "x"))),
				one("other org", req("refdiff", d("org", "other", "user", u))),
				one("intermediate node with a limit", req("refdiff", d("level", "top"))),
				one("its child", req("refdiff", d("level", "top", "sub", "deep"))),
				one("its child, other value", req("refdiff", d("level", "top", "sub", "other"))),
			)
		}()},
		{name: "replaces", limited: true, steps: func() []step {
			u := unique("r")
			return steps(
				repeat(3, "acme_user replaced by tier gold", func() *rlsv3.RateLimitRequest {
					return req("refdiff", d("org", "acme", "user", u), d("tier", "gold", "user", u))
				}),
				one("acme_user alone: not consumed while replaced", req("refdiff", d("org", "acme", "user", u))),
			)
		}()},
		{name: "wildcard values", limited: true, reachesOver: true, steps: steps(
			repeat(5, "/api/a", func() *rlsv3.RateLimitRequest { return req("refdiff", d("path", "/api/a")) }),
			one("/api/b: own counter", req("refdiff", d("path", "/api/b"))),
			one("/api/exact: exact beats wildcard", req("refdiff", d("path", "/api/exact"))),
			one("/api/: empty suffix", req("refdiff", d("path", "/api/"))),
			one("/apix: no match", req("refdiff", d("path", "/apix"))),
		)},
		{name: "value-only node without a limit", limited: true, reachesOver: true, steps: steps(
			repeat(2, "listed ok", func() *rlsv3.RateLimitRequest { return req("refdiff", d("listed", "ok")) }),
			repeat(2, "listed other", func() *rlsv3.RateLimitRequest { return req("refdiff", d("listed", "other")) }),
		)},
		{name: "zero limit blocks", limited: true, reachesOver: true, steps: steps(
			one("block", req("refdiff", d("block", "x"))),
			one("block with unlimited and unknown", req("refdiff", d("block", "x"), d("free", "y"), d("nothing", "z"))),
		)},
		{name: "several descriptors, none denied", limited: true, steps: func() []step {
			u := unique("m")
			return repeat(3, "daily, acme user, free, nothing", func() *rlsv3.RateLimitRequest {
				return req("refdiff", d("daily", u), d("org", "acme", "user", u), d("free", u), d("nothing", u))
			})
		}()},
		{name: "descriptors without entries or keys", limited: true, steps: steps(
			one("no entries", req("refdiff", &rlcommon.RateLimitDescriptor{})),
			one("empty key", req("refdiff", d("", "v"))),
			one("no entries next to a limit", req("another", &rlcommon.RateLimitDescriptor{}, d("key2", unique("e")))),
		)},
		{name: "refused requests", steps: steps(
			one("empty domain", req("", d("key1", "x"))),
			one("no descriptors", req("basic")),
		)},
		{name: "limit override", limited: true, reachesOver: true, steps: func() []step {
			u := unique("o")
			return steps(
				repeat(3, "override 2 per hour on daily", func() *rlsv3.RateLimitRequest {
					return req("refdiff", override(d("daily", u), 2, "hour"))
				}),
				one("override on an unknown key", req("refdiff", override(d("nothing", u), 5, "minute"))),
				one("override without entries", req("refdiff", override(&rlcommon.RateLimitDescriptor{}, 4, "day"))),
				one("override on an unknown domain", req("nowhere", override(d("daily", u), 5, "minute"))),
			)
		}()},
	}
}

// TestDifferentialHeadersOff runs every scenario against both servers
// with LIMIT_RESPONSE_HEADERS_ENABLED=false: no headers, no body.
func TestDifferentialHeadersOff(t *testing.T) {
	p := startPair(t, []string{"LIMIT_RESPONSE_HEADERS_ENABLED=false"}, map[string]string{"refdiff.yaml": refdiffConfig})
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
	}
}

// TestDifferentialHeadersOn runs every scenario with
// LIMIT_RESPONSE_HEADERS_ENABLED=true, one header renamed
// (LIMIT_REMAINING_HEADER) and the others under the reference's default
// names.
func TestDifferentialHeadersOn(t *testing.T) {
	p := startPair(t, []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-Left"}, map[string]string{"refdiff.yaml": refdiffConfig})
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
	}
}

// TestDifferentialNoHeaderVariable: with none of the header variables
// set (the reference's defaults), no headers either.
func TestDifferentialNoHeaderVariable(t *testing.T) {
	p := startPair(t, nil, map[string]string{"refdiff.yaml": refdiffConfig})
	for _, sc := range scenarios() {
		if sc.reachesOver {
			t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
		}
	}
}

// Documented differences of dynamic_metadata (RESPONSE_DYNAMIC_METADATA).
var (
	// The pinned reference adds quotaModeEnabled (always) and
	// quotaModeViolations (indexes of the quota descriptors over their
	// limit) to dynamic_metadata; envoyproxy/ratelimit replaced both
	// later by metadata, the merged config metadata of the descriptors
	// that passed, which is what ratelimitd sends.
	quotaMetadataFields = difference{
		name: "quotaModeEnabled/quotaModeViolations (pinned reference) vs metadata (later reference, ratelimitd)",
		normalize: func(ref, ours *rlsv3.RateLimitResponse) {
			if m := ref.GetDynamicMetadata(); m != nil {
				delete(m.Fields, "quotaModeEnabled")
				delete(m.Fields, "quotaModeViolations")
			}
			if m := ours.GetDynamicMetadata(); m != nil {
				delete(m.Fields, "metadata")
			}
		},
	}
	// The reference writes a descriptor's limit override with the
	// protobuf text format, whose spacing protobuf-go varies on purpose
	// from build to build ("requests_per_unit:2 unit:HOUR" or with two
	// spaces); compared with runs of spaces collapsed.
	overrideTextSpacing = difference{
		name: "spacing of descriptors[].limit (protobuf text format)",
		normalize: func(ref, ours *rlsv3.RateLimitResponse) {
			for _, r := range []*rlsv3.RateLimitResponse{ref, ours} {
				for _, v := range r.GetDynamicMetadata().GetFields()["descriptors"].GetListValue().GetValues() {
					f := v.GetStructValue().GetFields()
					if l, ok := f["limit"]; ok {
						f["limit"] = structpb.NewStringValue(strings.Join(strings.Fields(l.GetStringValue()), " "))
					}
				}
			}
		},
	}
)

// TestDifferentialDynamicMetadataGlobalShadow runs every scenario with
// RESPONSE_DYNAMIC_METADATA=true and SHADOW_MODE=true (global shadow
// mode: the overall code is OK, the statuses say OVER_LIMIT) and the
// headers on.
func TestDifferentialDynamicMetadataGlobalShadow(t *testing.T) {
	p := startPair(t, []string{"RESPONSE_DYNAMIC_METADATA=true", "SHADOW_MODE=true", "LIMIT_RESPONSE_HEADERS_ENABLED=true"},
		map[string]string{"refdiff.yaml": refdiffConfig})
	p.differences = []difference{quotaMetadataFields, overrideTextSpacing}
	for _, sc := range scenarios() {
		sc.reachesOver = false // global shadow mode: never OVER_LIMIT overall
		t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
	}
}

// TestStartPairRetries: when the port picked for a server's HTTP listener
// is taken before the server binds it (here by the test; in a parallel
// run, by another process), the server exits with "address already in
// use" and is started again on fresh ports, and the pair then answers.
func TestStartPairRetries(t *testing.T) {
	p := startPairWith(t, pairConfig{takeHTTPPort: true, extra: map[string]string{"refdiff.yaml": refdiffConfig}})
	if p.starts != 4 {
		t.Errorf("%d starts; want 4 (each server twice: the first found its HTTP port taken)", p.starts)
	}
	req := &rlsv3.RateLimitRequest{Domain: "refdiff-probe-no-such-domain", Descriptors: []*rlcommon.RateLimitDescriptor{d("probe", "x")}}
	for _, s := range []*proc{p.ref, p.ours} {
		if a := ask(s, req); a.err != nil || a.resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("%s after its second start: %v %v; want OK", s.name, a.resp, a.err)
		}
	}
}
