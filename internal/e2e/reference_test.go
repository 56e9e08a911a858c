package e2e

import (
	"path/filepath"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// want is the expected answer for one descriptor: code, limit
// (requests_per_unit; -1 = no current_limit) and limit_remaining.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	limit     int64
	remaining uint32
}

// step is one ShouldRateLimit call and its expected answer.
type step struct {
	name    string
	domain  string
	descs   []*rlcommon.RateLimitDescriptor
	overall rlsv3.RateLimitResponse_Code
	want    []want
}

// TestReferenceExamples loads examples/config-reference into a running
// ratelimitd and checks the answers each file's header documents, which
// are the answers envoyproxy/ratelimit documents for its README examples
// (descriptor matching and limit selection). Limits are per minute or
// longer, and the sequence starts at least 15 s before a minute tick, so
// no window boundary falls inside it: every answer must match.
func TestReferenceExamples(t *testing.T) {
	const none = -1
	d := desc
	steps := []step{
		// nested-defaults.yaml
		{"marketing 1", "messaging", ds(d("message_type", "marketing", "to_number", "111")), ok, []want{{ok, 5, 4}}},
		{"default number", "messaging", ds(d("to_number", "111")), ok, []want{{ok, 100, 99}}},
		{"both descriptors", "messaging", ds(d("message_type", "marketing", "to_number", "111"), d("to_number", "111")), ok, []want{{ok, 5, 3}, {ok, 100, 98}}},
		{"marketing 3", "messaging", ds(d("message_type", "marketing", "to_number", "111")), ok, []want{{ok, 5, 2}}},
		{"marketing 4", "messaging", ds(d("message_type", "marketing", "to_number", "111")), ok, []want{{ok, 5, 1}}},
		{"marketing 5", "messaging", ds(d("message_type", "marketing", "to_number", "111")), ok, []want{{ok, 5, 0}}},
		{"marketing denied", "messaging", ds(d("message_type", "marketing", "to_number", "111"), d("to_number", "111")), over, []want{{over, 5, 0}, {ok, 100, 98}}},
		{"other number", "messaging", ds(d("message_type", "marketing", "to_number", "222")), ok, []want{{ok, 5, 4}}},
		{"no default at top", "messaging", ds(d("message_type", "transactional")), ok, []want{{ok, none, 0}}},
		{"intermediate node without limit", "messaging", ds(d("message_type", "marketing")), ok, []want{{ok, none, 0}}},
		{"per ip", "messaging", ds(d("remote_address", "10.1.1.1")), ok, []want{{ok, 10, 9}}},
		{"blocked ip", "messaging", ds(d("remote_address", "50.0.0.5")), over, []want{{over, 0, 0}}},
		// depth.yaml
		{"depth match", "depth", ds(d("key", "value")), ok, []want{{ok, 20, 19}}},
		{"deeper than config", "depth", ds(d("key", "value", "subkey", "subvalue")), ok, []want{{ok, none, 0}}},
		// wildcards.yaml
		{"exact beats wildcard", "wildcards", ds(d("path", "/api/v1/exact")), ok, []want{{ok, 7, 6}}},
		{"trailing wildcard", "wildcards", ds(d("path", "/api/v1/users")), ok, []want{{ok, 3, 2}}},
		{"own counter per value", "wildcards", ds(d("path", "/api/v1/orders")), ok, []want{{ok, 3, 2}}},
		{"first declared wildcard", "wildcards", ds(d("path", "/api/v2/x")), ok, []want{{ok, 1000, 999}}},
		{"middle wildcard barab", "wildcards", ds(d("host", "barab")), ok, []want{{ok, 4, 3}}},
		{"middle wildcard barb", "wildcards", ds(d("host", "barb")), ok, []want{{ok, 4, 3}}},
		{"middle wildcard no match", "wildcards", ds(d("host", "bara")), ok, []want{{ok, none, 0}}},
		{"middle wildcard prefix", "wildcards", ds(d("host", "xbarb")), ok, []want{{ok, none, 0}}},
		{"several wildcards", "wildcards", ds(d("file", "foo-bar-baz.txt")), ok, []want{{ok, 6, 5}}},
		{"several wildcards no match", "wildcards", ds(d("file", "foo-baz")), ok, []want{{ok, none, 0}}},
		{"share_threshold 1", "wildcards", ds(d("tenant", "acme-1")), ok, []want{{ok, 2, 1}}},
		{"share_threshold 2", "wildcards", ds(d("tenant", "acme-2")), ok, []want{{ok, 2, 0}}},
		{"share_threshold denied", "wildcards", ds(d("tenant", "acme-3")), over, []want{{over, 2, 0}}},
		// replaces.yaml
		{"specific alone", "replaces", ds(d("key_1", "value_1", "user", "bkthomps")), ok, []want{{ok, 5, 4}}},
		{"replaced", "replaces", ds(d("key_1", "value_1", "user", "bkthomps"), d("key_2", "value_2", "user", "bkthomps")), ok, []want{{ok, none, 0}, {ok, 10, 9}}},
		{"replaced counter untouched", "replaces", ds(d("key_1", "value_1", "user", "bkthomps")), ok, []want{{ok, 5, 3}}},
		// shadow.yaml
		{"shadow 1", "shadow", ds(d("experiment", "new-limit")), ok, []want{{ok, 1, 0}}},
		{"shadow over", "shadow", ds(d("experiment", "new-limit")), ok, []want{{ok, 1, 0}}},
		// unlimited.yaml
		{"default 1", "unlimited", ds(d("remote_address", "10.9.9.9")), ok, []want{{ok, 2, 1}}},
		{"unlimited", "unlimited", ds(d("remote_address", "10.0.0.1")), ok, []want{{ok, none, 4294967295}}},
		{"unlimited again", "unlimited", ds(d("remote_address", "10.0.0.1")), ok, []want{{ok, none, 4294967295}}},
		// quota.yaml
		{"quota a", "quota", ds(d("bucket", "a")), ok, []want{{ok, 1, 0}}},
		{"quota a over, b left", "quota", ds(d("bucket", "a"), d("bucket", "b")), ok, []want{{over, 1, 0}, {ok, 1, 0}}},
		{"all quota over", "quota", ds(d("bucket", "a"), d("bucket", "b")), over, []want{{over, 1, 0}, {over, 1, 0}}},
		// Denied only because every quota-mode descriptor is over: quota hits
		// are soft (one store call), so the allowed hard limit has been
		// counted, as envoyproxy/ratelimit counts it (docs/responses.md,
		// "One corner stays").
		{"quota over with hard ok", "quota", ds(d("bucket", "a"), d("hard", "x")), over, []want{{over, 1, 0}, {ok, 100, 99}}},
	}

	p := start(t, startOpts{args: []string{"--config", filepath.Join(repoRoot(t), "examples/config-reference")}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	// The minute windows must not turn over during the sequence.
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 15*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	for _, s := range steps {
		resp := call(t, cc, s.domain, s.descs...)
		if resp.GetOverallCode() != s.overall {
			t.Errorf("%s: overall %v, want %v", s.name, resp.GetOverallCode(), s.overall)
		}
		if len(resp.GetStatuses()) != len(s.want) {
			t.Errorf("%s: %d statuses, want %d", s.name, len(resp.GetStatuses()), len(s.want))
			continue
		}
		for i, w := range s.want {
			st := resp.GetStatuses()[i]
			limit := int64(-1)
			if st.GetCurrentLimit() != nil {
				limit = int64(st.GetCurrentLimit().GetRequestsPerUnit())
			}
			if st.GetCode() != w.code || limit != w.limit || st.GetLimitRemaining() != w.remaining {
				t.Errorf("%s: status %d = (%v, limit %d, remaining %d), want (%v, %d, %d)",
					s.name, i, st.GetCode(), limit, st.GetLimitRemaining(), w.code, w.limit, w.remaining)
			}
		}
	}
}

func ds(d ...*rlcommon.RateLimitDescriptor) []*rlcommon.RateLimitDescriptor { return d }
