package replay

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// TestMatchSmall: Match picks the virtual host and route as Envoy does and
// builds the descriptors of each rate_limits action on the small test
// config.
func TestMatchSmall(t *testing.T) {
	e, err := LoadEnvoy("testdata/small-envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v4 := netip.MustParseAddr("192.0.2.77")
	v6 := netip.MustParseAddr("2001:db8::7")
	tests := []struct {
		name    string
		host    string
		client  netip.Addr
		method  string
		path    string
		headers map[string]string
		noRoute bool
		want    []string
	}{
		{name: "vhost by host", host: "other.example", client: v4, path: "/o", want: []string{"generic_key=other"}},
		{name: "no route in vhost", host: "other.example", client: v4, path: "/x", noRoute: true},
		{name: "wildcard vhost, no route limits: vh limits", client: v4, path: "/EXACT", want: []string{"remote_address=192.0.2.77"}},
		{name: "include_vh_rate_limits", client: v6, path: "/heavy/1?q", want: []string{"route_class=heavy", "remote_address=2001:db8::7"}},
		{name: "missing header drops descriptor, skip_if_absent drops entry", client: v4, path: "/ua", headers: map[string]string{"user-agent": "curl/8"}, want: []string{"ua=curl/8"}},
		{name: "query parameter", client: v4, path: "/ua?id=5&x", headers: map[string]string{"user-agent": "curl/8"}, want: []string{"ua=curl/8,id=5"}},
		{name: "route header matcher fails", client: v4, path: "/ua", headers: map[string]string{"user-agent": "Mozilla"}, want: []string{"remote_address=192.0.2.77"}},
		{name: "prefix is case sensitive", client: v4, path: "/UA", headers: map[string]string{"user-agent": "curl/8"}, want: []string{"remote_address=192.0.2.77"}},
		{name: "safe_regex full match, v4 /24", client: v4, path: "/r/123?x=1", want: []string{"destination_cluster=app,masked_remote_address=192.0.2.0/24"}},
		{name: "v6 default mask 128", client: v6, path: "/r/9", want: []string{"destination_cluster=app,masked_remote_address=2001:db8::7/128"}},
		{name: "safe_regex partial is no match", client: v4, path: "/r/12a", want: []string{"remote_address=192.0.2.77"}},
		{name: "vh_rate_limits IGNORE", client: v4, path: "/nolimits", want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.method
			if m == "" {
				m = "GET"
			}
			r := &Request{Client: tc.client, Method: m, Path: tc.path, Headers: tc.headers}
			route, ok := e.Match(tc.host, r)
			if ok == tc.noRoute {
				t.Fatalf("matched = %v, want %v", ok, !tc.noRoute)
			}
			got := compactAll(route.Descriptors)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("descriptors (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMatchWebsite: Match builds the website example's descriptors,
// including its apply_on_stream_done ones, for each kind of request.
func TestMatchWebsite(t *testing.T) {
	e, err := LoadEnvoy("../../envoy/website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v4 := netip.MustParseAddr("198.18.0.216")
	v6 := netip.MustParseAddr("2001:db8:0:2a3::1f")
	ip := "remote_address=198.18.0.216"
	net := "masked_remote_address=198.18.0.0/24"
	tests := []struct {
		name   string
		client netip.Addr
		method string
		path   string
		want   []string
		done   []string
	}{
		{"page", v4, "GET", "/blog/x.html", []string{ip, net}, nil},
		{"v6 /64", v6, "GET", "/", []string{"remote_address=2001:db8:0:2a3::1f", "masked_remote_address=2001:db8:0:2a3::/64"}, nil},
		{"feed on /", v4, "GET", "/?flav=rss", []string{ip, net, "feed=rss," + ip}, nil},
		{"not a feed", v4, "GET", "/?flavour=rss", []string{ip, net}, nil},
		{"costly tag feed", v4, "GET", "/blog/tags/puppet?flav=atom", []string{"route_class=costly," + ip, ip, net, "feed=rss," + ip}, nil},
		{"costly page query", v4, "GET", "/?page=2", []string{"route_class=costly," + ip, ip, net}, nil},
		{"login probe: route limits only", v4, "GET", "/wp-login.php", []string{"route_class=login," + ip}, nil},
		{"admin probe", v4, "GET", "/wp-admin/setup.php", []string{"route_class=login," + ip}, nil},
		{"not a probe", v4, "GET", "/wp-login.php.bak", []string{ip, net}, nil},
		{"write", v4, "POST", "/blog/x", []string{ip, net, "method=write," + ip}, nil},
		{"head is not a write", v4, "HEAD", "/blog/x", []string{ip, net}, nil},
		{"search lease and release", v4, "GET", "/search?q=x", []string{"destination_cluster=search", "destination_cluster=search," + ip, ip, net},
			[]string{"destination_cluster=search,ratelimitd.release=1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			route, ok := e.Match("", &Request{Client: tc.client, Method: tc.method, Path: tc.path, Headers: map[string]string{"user-agent": "x"}})
			if !ok {
				t.Fatal("no route")
			}
			got, done := compactAll(route.Descriptors), compactAll(route.OnStreamDone)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("descriptors (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.done, done); diff != "" {
				t.Errorf("stream-done descriptors (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadEnvoyRejectsUnreplayableActions: an action a log cannot
// reproduce (metadata) is refused when the Envoy file is loaded.
func TestLoadEnvoyRejectsUnreplayableActions(t *testing.T) {
	b, err := DecodeBootstrap([]byte(routeBootstrap + `
                              - actions: [ { metadata: { descriptor_key: k, metadata_key: { key: a, path: [ { key: b } ] } } } ]
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: d
                      rate_limit_service: { transport_api_version: V3, grpc_service: { envoy_grpc: { cluster_name: c } } }
`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewEnvoy(b); err == nil {
		t.Fatal("metadata action accepted; a log cannot reproduce it")
	}
}

// compactAll renders each descriptor of ds as compact does (nil for none).
func compactAll(ds []Descriptor) []string {
	var out []string
	for _, d := range ds {
		out = append(out, compact(d.Entries))
	}
	return out
}

// compact renders entries as "k=v,k=v".
func compact(es []policy.Entry) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, e.Key+"="+e.Value)
	}
	return strings.Join(parts, ",")
}
