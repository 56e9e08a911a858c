package replay

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// routeBootstrap is the start of a bootstrap with one listener whose HTTP
// connection manager routes "/" to cluster c; the rate_limits of the
// route (items indented by 30 spaces) and http_filters (a key indented by
// 16) follow.
const routeBootstrap = `
static_resources:
  listeners:
    - name: l
      address: {socket_address: {address: 127.0.0.1, port_value: 1}}
      filter_chains:
        - filters:
            - name: hcm
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: t
                route_config:
                  virtual_hosts:
                    - name: v
                      domains: ["*"]
                      routes:
                        - match: {prefix: "/"}
                          route:
                            cluster: c
                            rate_limits:`

// replayOptions are the Options of a replay of e under set, on a memory
// store closed when t ends and a Clock the replay moves.
func replayOptions(t *testing.T, e *Envoy, set *policy.Set) Options {
	t.Helper()
	clock := &Clock{}
	st, err := memory.New(memory.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return Options{Envoy: e, Policy: set, Store: st, Clock: clock}
}

// mutationBootstrap is an HTTP connection manager whose filters are before +
// the rate-limit filter + after + the router; the route sends one enforced
// descriptor per header of hdrs (request_headers, key = header name) and one
// apply_on_stream_done descriptor with the same actions.
func mutationBootstrap(before, after string, hdrs ...string) string {
	var acts strings.Builder
	for _, h := range hdrs {
		fmt.Fprintf(&acts, "\n                                  - request_headers: {header_name: %s, descriptor_key: %s, skip_if_absent: true}", h, h)
	}
	filter := func(name, muts string) string {
		if muts == "" {
			return ""
		}
		return `
                  - name: ` + name + `
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
                      mutations:
                        request_mutations: ` + muts
	}
	return routeBootstrap + `
                              - actions:` + acts.String() + `
                              - apply_on_stream_done: true
                                actions:` + acts.String() + `
                http_filters:` + filter("before", before) + `
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: d
                      rate_limit_service: {transport_api_version: V3, grpc_service: {envoy_grpc: {cluster_name: c}}}` + filter("after", after) + `
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`
}

func envoyFrom(t *testing.T, doc string) (*Envoy, error) {
	t.Helper()
	b, err := DecodeBootstrap([]byte(doc))
	if err != nil {
		t.Fatalf("decode: %v\n%s", err, doc)
	}
	return NewEnvoy(b)
}

// TestHeaderMutationSemantics: request mutations of header_mutation filters
// after the rate-limit filter shape only the stream-done descriptors of a
// request let through; the enforced descriptors and the stream-done
// descriptors of a denied request see the request as given (Request is what
// the rate-limit filter sees: filters before it are not applied).
func TestHeaderMutationSemantics(t *testing.T) {
	tests := []struct {
		name          string
		before, after string
		in            map[string]string
		hdr           string // the header the descriptors read
		seen, passed  string // its value ("" = absent) before/after the rate-limit filter
	}{
		{name: "filters before are not applied", before: "[{remove: x-a}]", hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1", passed: "1"},
		{name: "remove", after: "[{remove: X-A}]", hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1"},
		{name: "remove_on_match", after: "[{remove_on_match: {key_matcher: {prefix: x-}}}]", hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1"},
		{name: "remove_on_match regex", after: `[{remove_on_match: {key_matcher: {safe_regex: {regex: "x-[ab]"}}}}]`, hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1"},
		{name: "remove_on_match no match", after: "[{remove_on_match: {key_matcher: {exact: x-b}}}]", hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1", passed: "1"},
		{name: "after: added only when let through", after: `[{append: {header: {key: X-A, value: "1"}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}}]`, hdr: "x-a", passed: "1"},
		{name: "default append_action appends", after: `[{append: {header: {key: x-a, value: "2"}}}]`, hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1", passed: "1,2"},
		{name: "ADD_IF_ABSENT keeps", after: `[{append: {header: {key: x-a, value: "2"}, append_action: ADD_IF_ABSENT}}]`, hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1", passed: "1"},
		{name: "ADD_IF_ABSENT adds", after: `[{append: {header: {key: x-a, value: "2"}, append_action: ADD_IF_ABSENT}}]`, hdr: "x-a", passed: "2"},
		{name: "OVERWRITE_IF_EXISTS absent", after: `[{append: {header: {key: x-a, value: "2"}, append_action: OVERWRITE_IF_EXISTS}}]`, hdr: "x-a"},
		{name: "OVERWRITE_IF_EXISTS present", after: `[{append: {header: {key: x-a, value: "2"}, append_action: OVERWRITE_IF_EXISTS}}]`, hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1", passed: "2"},
		{name: "deprecated append false overwrites", after: `[{append: {header: {key: x-a, value: "2"}, append: false}}]`, hdr: "x-a", in: map[string]string{"x-a": "1"}, seen: "1", passed: "2"},
		{name: "empty value dropped", after: `[{append: {header: {key: x-a, value: ""}}}]`, hdr: "x-a"},
		{name: "raw_value", after: `[{append: {header: {key: x-a, raw_value: "cmF3"}}}]`, hdr: "x-a", passed: "raw"},
		{name: "in order: remove then add", after: `[{remove: x-a}, {append: {header: {key: x-a, value: "1"}}}]`, hdr: "x-a", in: map[string]string{"x-a": "2"}, seen: "2", passed: "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := envoyFrom(t, mutationBootstrap(tc.before, tc.after, tc.hdr))
			if err != nil {
				t.Fatal(err)
			}
			r := &Request{Client: netip.MustParseAddr("192.0.2.1"), Method: "GET", Path: "/", Headers: tc.in}
			var in map[string]string
			if tc.in != nil {
				in = map[string]string{}
				for k, v := range tc.in {
					in[k] = v
				}
			}
			rt, ok := e.Match("", r)
			if !ok {
				t.Fatal("no route")
			}
			if !cmp.Equal(in, r.Headers) {
				t.Errorf("Match modified the request: %v, was %v", r.Headers, in)
			}
			value := func(ds []Descriptor) string {
				if len(ds) == 0 {
					return ""
				}
				if len(ds) != 1 || len(ds[0].Entries) != 1 || ds[0].Entries[0].Key != tc.hdr {
					t.Fatalf("descriptors %+v", ds)
				}
				return ds[0].Entries[0].Value
			}
			if got := value(rt.Descriptors); got != tc.seen {
				t.Errorf("enforced: %s = %q, want %q", tc.hdr, got, tc.seen)
			}
			if got := value(rt.OnStreamDoneDenied); got != tc.seen {
				t.Errorf("stream done after a denial: %s = %q, want %q", tc.hdr, got, tc.seen)
			}
			if got := value(rt.OnStreamDone); got != tc.passed {
				t.Errorf("stream done after the request was let through: %s = %q, want %q", tc.hdr, got, tc.passed)
			}
		})
	}
}

// TestLoadEnvoyRejectsUnreplayableHeaderMutation: a header mutation after
// the rate-limit filter that a replay cannot reproduce (formatters,
// pseudo-headers, Host, query parameters, per-route config) is refused.
func TestLoadEnvoyRejectsUnreplayableHeaderMutation(t *testing.T) {
	perRoute := strings.Replace(mutationBootstrap("", "[{remove: x-b}]", "x-a"), `                http_filters:`, `                          typed_per_filter_config:
                            after:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutationPerRoute
                              mutations: {request_mutations: [{remove: x-a}]}
                http_filters:`, 1)
	if !strings.Contains(perRoute, "HeaderMutationPerRoute") {
		t.Fatal("per-route replacement did not apply")
	}
	cases := map[string]string{
		"formatter value":  mutationBootstrap("", `[{append: {header: {key: x-a, value: "%REQ(x-b)%"}}}]`, "x-a"),
		"pseudo-header":    mutationBootstrap("", `[{remove: ":path"}]`, "x-a"),
		"host":             mutationBootstrap("", `[{append: {header: {key: Host, value: "h"}}}]`, "x-a"),
		"query parameters": strings.Replace(mutationBootstrap("", "[{remove: x-b}]", "x-a"), "request_mutations: [{remove: x-b}]", "query_parameter_mutations: [{remove: q}]", 1),
		"per-route":        perRoute,
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := envoyFrom(t, doc); err == nil {
				t.Fatal("accepted; a replay cannot reproduce it")
			}
		})
	}
	if _, err := envoyFrom(t, mutationBootstrap("", "[{remove: x-b}]", "x-a")); err != nil {
		t.Fatalf("control: %v", err)
	}
	// Filters before the rate-limit filter are not applied, so they do not
	// make a file unreplayable.
	if _, err := envoyFrom(t, mutationBootstrap(`[{append: {header: {key: x-a, value: "%REQ(x-b)%"}}}]`, "", "x-a")); err != nil {
		t.Fatalf("formatter before the rate-limit filter: %v", err)
	}
}

// TestMatchWebsiteGatedRelease: envoy/website.yaml sends the /search lease
// release only for a search the rate-limit filter let through. (Client
// copies of the marker are stripped before the rate-limit filter: checked
// by envoy/envoy_test.go; Request is what the rate-limit filter sees.)
func TestMatchWebsiteGatedRelease(t *testing.T) {
	e, err := LoadEnvoy("../../envoy/website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := &Request{Client: netip.MustParseAddr("192.0.2.1"), Method: "GET", Path: "/search?q=x", Headers: map[string]string{"user-agent": "x"}}
	rt, ok := e.Match("", r)
	if !ok {
		t.Fatal("no route")
	}
	if _, set := r.Headers["x-ratelimitd-lease"]; set {
		t.Error("Match modified the request")
	}
	done, denied := compactAll(rt.OnStreamDone), compactAll(rt.OnStreamDoneDenied)
	if diff := cmp.Diff([]string{"destination_cluster=search,ratelimitd.release=1"}, done); diff != "" {
		t.Errorf("let through (-want +got):\n%s", diff)
	}
	if len(denied) != 0 {
		t.Errorf("denied by Envoy, yet a release is sent: %v", denied)
	}
	for _, d := range rt.Descriptors {
		for _, en := range d.Entries {
			if en.Key == policy.ReleaseKey {
				t.Errorf("release entry in an enforced descriptor: %v", d.Entries)
			}
		}
	}
}

// TestRunSendsReleaseOnlyWhenLetThrough replays 11 searches of one client in
// one minute through examples/website (search-per-ip: 10 a minute): the 11th
// is denied and, with envoy/website.yaml's gated release, sends no
// stream-done call; with the ungated form (a generic_key release) it does.
func TestRunSendsReleaseOnlyWhenLetThrough(t *testing.T) {
	gated, err := os.ReadFile("../../envoy/website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ungated := strings.Replace(string(gated), `                                  - request_headers:
                                      header_name: x-ratelimitd-lease
                                      descriptor_key: ratelimitd.release`,
		`                                  - generic_key: {descriptor_key: ratelimitd.release, descriptor_value: "1"}`, 1)
	if ungated == string(gated) {
		t.Fatal("envoy/website.yaml: the gated release was not found")
	}
	var log strings.Builder
	for i := range 11 {
		fmt.Fprintf(&log, "192.0.2.9 - - [17/May/2015:10:05:%02d +0000] \"GET /search?q=%d HTTP/1.1\" 200 10 \"-\" \"Mozilla/5.0\"\n", i, i)
	}
	set, _, err := policy.Load(policy.LoadOptions{}, "../../examples/website")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		doc       string
		wantCalls int
	}{{"gated", string(gated), 10}, {"ungated", ungated, 11}} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := envoyFrom(t, tc.doc)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Run(context.Background(), strings.NewReader(log.String()), replayOptions(t, e, set))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests != 11 || rep.Allowed != 10 || rep.Denied != 1 {
				t.Fatalf("requests %d allowed %d denied %d, want 11/10/1", rep.Requests, rep.Allowed, rep.Denied)
			}
			if rep.StreamDoneCalls != tc.wantCalls {
				t.Errorf("stream-done calls %d, want %d", rep.StreamDoneCalls, tc.wantCalls)
			}
		})
	}
}
