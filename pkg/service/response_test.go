package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// sfItem is a parsed RFC 9651 list member: the String value and its
// integer (or string) parameters.
type sfItem struct {
	Name   string
	Params map[string]any
}

// parseList parses a header value with httpsfv's RFC 9651 parser and
// checks that every member is an Item whose value is a String.
func parseList(t *testing.T, v string) []sfItem {
	t.Helper()
	l, err := httpsfv.UnmarshalList([]string{v})
	if err != nil {
		t.Fatalf("parse %q: %v", v, err)
	}
	var out []sfItem
	for _, m := range l {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%q: member %T is not an Item", v, m)
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%q: item value %T is not a String", v, it.Value)
		}
		p := map[string]any{}
		for _, k := range it.Params.Names() {
			p[k], _ = it.Params.Get(k)
		}
		out = append(out, sfItem{name, p})
	}
	return out
}

func q(name string, quota, w int64) sfItem {
	return sfItem{name, map[string]any{"q": quota, "w": w}}
}

func r(name string, remaining, t int64) sfItem {
	return sfItem{name, map[string]any{"r": remaining, "t": t}}
}

func TestIETFHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		calls   int // identical calls before the checked one
		req     func() *rlsv3.RateLimitRequest
		policy  []sfItem
		limit   []sfItem
		advance time.Duration
	}{
		{
			name: "fixed window", req: func() *rlsv3.RateLimitRequest { return req("svc", d("user", "u")) },
			policy: []sfItem{q("svc.user", 10, 60)}, limit: []sfItem{r("svc.user", 9, 30)},
		},
		{
			name: "several limits on one node, config order", req: func() *rlsv3.RateLimitRequest { return req("svc", d("multi", "m")) },
			policy: []sfItem{q("per-10s", 3, 10), q("per-hour", 5, 3600)},
			limit:  []sfItem{r("per-10s", 2, 10), r("per-hour", 4, 3570)},
		},
		{
			name: "descriptor order", req: func() *rlsv3.RateLimitRequest { return req("svc", d("small", "s"), d("free", "x"), d("user", "u")) },
			policy: []sfItem{q("small", 2, 60), q("svc.user", 10, 60)},
			limit:  []sfItem{r("small", 1, 30), r("svc.user", 9, 30)},
		},
		{
			name: "token bucket t is the time to the next token", req: func() *rlsv3.RateLimitRequest { return req("svc", d("bucket", "b")) },
			policy: []sfItem{q("svc.bucket", 6, 60)}, limit: []sfItem{r("svc.bucket", 2, 10)},
		},
		{
			name: "token bucket partly refilled", calls: 3, advance: 4 * time.Second,
			req:    func() *rlsv3.RateLimitRequest { return req("svc", d("bucket", "b")) },
			policy: []sfItem{q("svc.bucket", 6, 60)}, limit: []sfItem{r("svc.bucket", 0, 6)},
		},
		{
			name: "denied keeps headers", calls: 2, req: func() *rlsv3.RateLimitRequest { return req("svc", d("small", "s")) },
			policy: []sfItem{q("small", 2, 60)}, limit: []sfItem{r("small", 0, 30)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			for i := 0; i < tc.calls; i++ {
				e.call(t, tc.req())
			}
			e.clock.Advance(tc.advance)
			h := headers(t, e.call(t, tc.req()))
			if diff := cmp.Diff(tc.policy, parseList(t, h["RateLimit-Policy"])); diff != "" {
				t.Errorf("RateLimit-Policy %q (-want +got):\n%s", h["RateLimit-Policy"], diff)
			}
			if diff := cmp.Diff(tc.limit, parseList(t, h["RateLimit"])); diff != "" {
				t.Errorf("RateLimit %q (-want +got):\n%s", h["RateLimit"], diff)
			}
		})
	}
}

func TestHeaderModes(t *testing.T) {
	for _, tc := range []struct {
		mode service.HeaderMode
		want []string // header names present on an OK response
	}{
		{service.HeadersIETF, []string{"RateLimit", "RateLimit-Policy"}},
		{service.HeadersLegacy, []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}},
		{service.HeadersBoth, []string{"RateLimit", "RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}},
		{service.HeadersNone, nil},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			e := newEnv(t, func(o *service.Options) { o.Headers = tc.mode })
			// multi: per-10s has 2 left, per-hour 4: legacy reports per-10s.
			h := headers(t, e.call(t, req("svc", d("multi", "m"), d("user", "u"))))
			var got []string
			for k := range h {
				got = append(got, k)
			}
			if diff := cmp.Diff(tc.want, got, cmpSorted); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			if tc.mode == service.HeadersLegacy {
				want := map[string]string{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "10"}
				if diff := cmp.Diff(want, h); diff != "" {
					t.Errorf("legacy values (-want +got):\n%s", diff)
				}
			}
		})
	}
}

var cmpSorted = cmp.Transformer("sort", func(in []string) []string {
	out := append([]string(nil), in...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
})

func TestProblemBodyAndRetryAfter(t *testing.T) {
	e := newEnv(t, nil)
	e.call(t, req("svc", d("small", "s")))
	e.call(t, req("svc", d("small", "s")))
	resp := e.call(t, req("svc", d("small", "s"), d("user", "u")))
	if resp.GetOverallCode() != OVER {
		t.Fatalf("overall %v", resp.GetOverallCode())
	}
	h := headers(t, resp)
	if h["Content-Type"] != "application/problem+json" {
		t.Errorf("Content-Type %q", h["Content-Type"])
	}
	if h["Retry-After"] != "30" {
		t.Errorf("Retry-After %q, want 30 (window end, no jitter)", h["Retry-After"])
	}
	var p map[string]any
	if err := json.Unmarshal(resp.GetRawBody(), &p); err != nil {
		t.Fatalf("body %q: %v", resp.GetRawBody(), err)
	}
	want := map[string]any{
		"type":              "https://iana.org/assignments/http-problem-types#quota-exceeded",
		"title":             "Quota Exceeded",
		"status":            float64(429),
		"detail":            `Policy "small" allows 2 requests per 60 seconds; retry after 30 seconds.`,
		"violated-policies": []any{"small"},
		"retry_after":       float64(30),
	}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("problem (-want +got):\n%s", diff)
	}
	// OK responses carry neither body nor Retry-After nor Content-Type.
	ok := e.call(t, req("svc", d("user", "u")))
	if h := headers(t, ok); h["Retry-After"] != "" || h["Content-Type"] != "" || ok.GetRawBody() != nil {
		t.Errorf("OK response with denial fields: %v %q", h, ok.GetRawBody())
	}
}

func TestProblemOptions(t *testing.T) {
	e := newEnv(t, func(o *service.Options) {
		o.ProblemTypeBase = "https://example.com/problems/"
		o.ProblemDetail = "{policy}: {quota} per {window}s, wait {retry_after}s"
	})
	e.call(t, req("svc", d("small", "s")))
	e.call(t, req("svc", d("small", "s")))
	var p service.Problem
	if err := json.Unmarshal(e.call(t, req("svc", d("small", "s"))).GetRawBody(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Type != "https://example.com/problems/quota-exceeded" || p.Detail != "small: 2 per 60s, wait 30s" {
		t.Errorf("problem %+v", p)
	}
}

func TestRetryAfterJitter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rand   float64
		jitter time.Duration
		key    string
		calls  int
		want   int64 // Retry-After
	}{
		{"window, no jitter", 0, 5 * time.Second, "small", 2, 30},
		{"window, half jitter", 0.5, 5 * time.Second, "small", 2, 33},    // ceil(30 + 2.5)
		{"window, max jitter", 0.999, 5 * time.Second, "small", 2, 35},   // ceil(30 + 4.995) <= 30 + 5
		{"disabled jitter", 0.999, -1, "small", 2, 30},                   // RetryJitter < 0
		{"token bucket next token", 0, 5 * time.Second, "bucket", 3, 10}, // 1 token per 10 s
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *service.Options) {
				o.RetryJitter = tc.jitter
				o.Rand = func() float64 { return tc.rand }
			})
			for i := 0; i < tc.calls; i++ {
				e.call(t, req("svc", d(tc.key, "k")))
			}
			resp := e.call(t, req("svc", d(tc.key, "k")))
			h := headers(t, resp)
			ra, err := strconv.ParseInt(h["Retry-After"], 10, 64)
			if err != nil || ra != tc.want {
				t.Fatalf("Retry-After %q, want %d", h["Retry-After"], tc.want)
			}
			lim := parseList(t, h["RateLimit"])
			if tt := lim[0].Params["t"].(int64); ra < tt {
				t.Errorf("Retry-After %d earlier than t=%d", ra, tt)
			}
			var p service.Problem
			if err := json.Unmarshal(resp.GetRawBody(), &p); err != nil || p.RetryAfter != ra {
				t.Errorf("body retry_after %d, header %d (%v)", p.RetryAfter, ra, err)
			}
		})
	}
}

func TestNearLimitHeader(t *testing.T) {
	e := newEnv(t, func(o *service.Options) { o.NearLimitHeader = true })
	for i := 1; i <= 10; i++ {
		h := headers(t, e.call(t, req("svc", d("user", "u"), d("big", "b"))))
		// 10 per minute, ratio 0.8: near once more than 8 are used.
		var want []sfItem
		if i > 8 {
			want = []sfItem{{"svc.user", map[string]any{}}, {"svc.big", map[string]any{}}}
		}
		var got []sfItem
		if v := h["Ratelimitd-Near-Limit"]; v != "" {
			got = parseList(t, v)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("call %d near-limit (-want +got):\n%s", i, diff)
		}
	}
}

func TestDynamicMetadata(t *testing.T) {
	e := newEnv(t, func(o *service.Options) { o.DynamicMetadata = true })
	// Use up small so its (absent) metadata would be excluded anyway.
	rq := req("svc", d("meta", "x"), withHits(d("meta2", "y"), 2), d("nomatch", "z"))
	rq.HitsAddend = 3
	resp := e.call(t, rq)
	want, err := structpb.NewStruct(map[string]any{
		"domain": "svc",
		"descriptors": []any{
			map[string]any{"entries": []any{"meta=x"}},
			map[string]any{"entries": []any{"meta2=y"}, "hitsAddend": 2.0},
			map[string]any{"entries": []any{"nomatch=z"}},
		},
		"hitsAddend": 3.0,
		"metadata":   map[string]any{"tier": "gold", "nested": map[string]any{"a": 1.0, "b": 2.0}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, resp.GetDynamicMetadata(), protocmp.Transform()); diff != "" {
		t.Errorf("dynamic metadata (-want +got):\n%s", diff)
	}
	// Not filled without the option.
	if m := newEnv(t, nil).call(t, req("svc", d("meta", "x"))).GetDynamicMetadata(); m != nil {
		t.Errorf("dynamic metadata without the option: %v", m)
	}
}

func TestPolicyNameEscaping(t *testing.T) {
	// A config name with quotes and a backslash must still serialize as a
	// valid RFC 9651 String that parses back to the same name.
	dir := t.TempDir()
	writeFile(t, dir+"/c.yaml", "domain: esc\ndescriptors:\n  - key: k\n    rate_limit: {name: 'a \"q\" \\\\ b', unit: second, requests_per_unit: 1}\n")
	e := newEnv(t, nil)
	e.svc.SetPolicy(loadSet(t, dir))
	h := headers(t, e.call(t, req("esc", d("k", "v"))))
	got := parseList(t, h["RateLimit-Policy"])
	if len(got) != 1 || !strings.Contains(got[0].Name, `"q"`) {
		t.Errorf("policy %q parsed to %v", h["RateLimit-Policy"], got)
	}
	_ = fmt.Sprint
	_ = context.Background
}
