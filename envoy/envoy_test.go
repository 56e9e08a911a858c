package envoy_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	rlfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/replay"
)

// files maps every shipped Envoy file to the ratelimitd config it drives and
// the number of proxies in front of it (xff_num_trusted_hops).
var files = map[string]struct {
	config string
	hops   uint32
}{
	"edge.yaml":    {"../examples/config", 0},
	"plans.yaml":   {"../examples/plans", 1},
	"shard.yaml":   {"../examples/shard", 1},
	"sidecar.yaml": {"../examples/config", 1},
	"website.yaml": {"../examples/website", 0},
}

// ringFiles maps each consistent-hash edge (no rate-limit filter of its
// own) to the shard bootstrap behind it (docs/quotas.md, "Without a shared
// store: consistent-hash routing").
var ringFiles = map[string]string{
	"shard-ring.yaml": "shard.yaml",
}

func TestEveryFileIsListed(t *testing.T) {
	names, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("no Envoy files found")
	}
	for _, n := range names {
		if _, ok := files[n]; !ok && ringFiles[n] == "" && rlqsFiles[n] == "" {
			t.Errorf("%s is not listed in files: say which config it drives", n)
		}
	}
}

func decode(t *testing.T, name string) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := replay.DecodeBootstrap(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b
}

// TestBootstrapValid decodes every file into Envoy's bootstrap proto (every
// typed_config must resolve), runs ValidateAll and checks the rate-limit
// wiring the project promises.
func TestBootstrapValid(t *testing.T) {
	for name, want := range files {
		t.Run(name, func(t *testing.T) {
			b := decode(t, name)
			clusters := map[string]*clusterv3.Cluster{}
			for _, c := range b.GetStaticResources().GetClusters() {
				clusters[c.GetName()] = c
			}
			found := 0
			for _, l := range b.GetStaticResources().GetListeners() {
				for _, fc := range l.GetFilterChains() {
					for _, f := range fc.GetFilters() {
						var hcm hcmv3.HttpConnectionManager
						if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
							continue
						}
						if !hcm.GetUseRemoteAddress().GetValue() {
							t.Errorf("listener %s: use_remote_address must be true", l.GetName())
						}
						if hcm.GetXffNumTrustedHops() != want.hops {
							t.Errorf("listener %s: xff_num_trusted_hops = %d, want %d", l.GetName(), hcm.GetXffNumTrustedHops(), want.hops)
						}
						var names []string
						for _, hf := range hcm.GetHttpFilters() {
							names = append(names, hf.GetName())
							var rl rlfilterv3.RateLimit
							if hf.GetTypedConfig().UnmarshalTo(&rl) != nil {
								continue
							}
							found++
							checkFilter(t, &rl, clusters)
						}
						if len(names) == 0 || names[len(names)-1] != "envoy.filters.http.router" {
							t.Errorf("listener %s: the router must be the last HTTP filter, got %v", l.GetName(), names)
						}
						if !slices.Contains(names, replay.RateLimitFilterName) {
							t.Errorf("listener %s: no %s filter", l.GetName(), replay.RateLimitFilterName)
						}
					}
				}
			}
			if found == 0 {
				t.Fatal("no rate-limit filter")
			}
		})
	}
}

func checkFilter(t *testing.T, rl *rlfilterv3.RateLimit, clusters map[string]*clusterv3.Cluster) {
	t.Helper()
	if rl.GetDomain() == "" {
		t.Error("rate-limit filter: empty domain")
	}
	if rl.GetFailureModeDeny() {
		t.Error("rate-limit filter: failure_mode_deny must be false (fail open)")
	}
	if d := rl.GetTimeout().AsDuration(); rl.GetTimeout() == nil || d <= 0 || d > 20e6 {
		t.Errorf("rate-limit filter: timeout %v, want explicit and at most 20ms", d)
	}
	if rl.GetEnableXRatelimitHeaders() != rlfilterv3.RateLimit_OFF {
		t.Error("rate-limit filter: enable_x_ratelimit_headers must be OFF (ratelimitd sends its own headers)")
	}
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion().String() != "V3" {
		t.Errorf("rate-limit filter: transport_api_version %v, want V3", svc.GetTransportApiVersion())
	}
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	c, ok := clusters[name]
	if !ok {
		t.Fatalf("rate-limit filter: grpc cluster %q is not defined", name)
	}
	any := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	var po upstreamhttpv3.HttpProtocolOptions
	if any == nil || any.UnmarshalTo(&po) != nil || po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster %s: gRPC needs HTTP/2 (typed_extension_protocol_options explicit_http_config http2_protocol_options)", name)
	}
	// The cluster health-checks ratelimitd over grpc.health.v1 for the
	// service name it reports NOT_SERVING for while draining and before
	// its first config (docs/kubernetes.md, "Graceful termination").
	grpcChecks := 0
	for _, hc := range c.GetHealthChecks() {
		g := hc.GetGrpcHealthCheck()
		if g == nil {
			continue
		}
		grpcChecks++
		if g.GetServiceName() != "envoy.service.ratelimit.v3.RateLimitService" {
			t.Errorf("cluster %s: grpc_health_check service_name %q, want envoy.service.ratelimit.v3.RateLimitService", name, g.GetServiceName())
		}
		if d := hc.GetTimeout().AsDuration(); d <= 0 || d > hc.GetInterval().AsDuration() {
			t.Errorf("cluster %s: health check timeout %v, want positive and at most the interval %v", name, d, hc.GetInterval().AsDuration())
		}
	}
	if grpcChecks != 1 {
		t.Errorf("cluster %s: %d gRPC health checks, want 1 (a draining ratelimitd must leave the pool)", name, grpcChecks)
	}
}

// TestDecodeRejects shows the decoder is strict: an unknown extension type,
// an unknown field and a proto constraint violation are all errors.
func TestDecodeRejects(t *testing.T) {
	good, err := os.ReadFile("website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		"unresolved Any": strings.Replace(string(good), "envoy.extensions.filters.http.router.v3.Router", "envoy.extensions.filters.http.nosuch.v3.Nosuch", 1),
		"unknown field":  strings.Replace(string(good), "failure_mode_deny: false", "failure_mode_deni: false", 1),
		"invalid value":  strings.Replace(string(good), "v6_prefix_mask_len: 64", "v6_prefix_mask_len: 129", 1),
	}
	for name, doc := range cases {
		if doc == string(good) {
			t.Fatalf("%s: replacement did not apply", name)
		}
		if _, err := replay.DecodeBootstrap([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// samples collects, per descriptor key, the values a config names (exact
// values, wildcard patterns with '*' replaced) plus a free value: the
// candidates for entries whose value comes from a request header.
func samples(t *testing.T, dir string) func(string) []string {
	vals := map[string][]string{}
	var walk func(n *yaml.Node, key string)
	walk = func(n *yaml.Node, key string) {
		switch n.Kind {
		case yaml.MappingNode:
			var k, v string
			for i := 0; i+1 < len(n.Content); i += 2 {
				switch n.Content[i].Value {
				case "key":
					k = n.Content[i+1].Value
				case "value":
					v = n.Content[i+1].Value
				}
			}
			if k != "" && v != "" {
				vals[k] = append(vals[k], strings.ReplaceAll(v, "*", "x"))
			}
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == "plans" {
					plansSamples(n.Content[i+1], vals)
				}
			}
			for i := 1; i < len(n.Content); i += 2 {
				walk(n.Content[i], key)
			}
		case yaml.SequenceNode, yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, key)
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var n yaml.Node
		if err := yaml.Unmarshal(data, &n); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		walk(&n, "")
	}
	return func(k string) []string { return append([]string{"k-3f9a1c"}, vals[k]...) }
}

// plansSamples adds the values a `plans:` block (docs/plans.md) names: its
// tier names for plan_key, route classes for route_key and exempt
// credentials for credential_key. The block has no key/value nodes of its
// own: they exist only in the expanded tree.
func plansSamples(p *yaml.Node, vals map[string][]string) {
	if p.Kind != yaml.MappingNode {
		return
	}
	field := map[string]*yaml.Node{}
	for i := 0; i+1 < len(p.Content); i += 2 {
		field[p.Content[i].Value] = p.Content[i+1]
	}
	str := func(k string) string {
		if n := field[k]; n != nil {
			return n.Value
		}
		return ""
	}
	names := func(key string, m *yaml.Node) {
		if key == "" || m == nil || m.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(m.Content); i += 2 {
			vals[key] = append(vals[key], m.Content[i].Value)
		}
	}
	names(str("plan_key"), field["tiers"])
	names(str("route_key"), field["routes"])
	if ex := field["exempt"]; ex != nil && str("credential_key") != "" {
		for _, it := range ex.Content {
			for i := 0; i+1 < len(it.Content); i += 2 {
				if it.Content[i].Value == "credential" {
					vals[str("credential_key")] = append(vals[str("credential_key")], it.Content[i+1].Value)
				}
			}
		}
	}
}

// TestDescriptorsMatchConfig enumerates every descriptor shape each Envoy
// file can send and requires a rule of its ratelimitd config to answer it
// (a descriptor that matches nothing is sent for nothing), and every
// apply_on_stream_done descriptor to be a concurrency lease release.
func TestDescriptorsMatchConfig(t *testing.T) {
	for name, want := range files {
		t.Run(name, func(t *testing.T) {
			set, _, err := policy.Load(policy.LoadOptions{}, want.config)
			if err != nil {
				t.Fatalf("load %s: %v", want.config, err)
			}
			e, err := replay.LoadEnvoy(name)
			if err != nil {
				t.Fatal(err)
			}
			if !set.HasDomain(e.Domain) {
				t.Fatalf("config %s has no domain %q", want.config, e.Domain)
			}
			shapes := e.Shapes(samples(t, want.config))
			if len(shapes) == 0 {
				t.Fatal("no descriptor shapes")
			}
			for _, s := range shapes {
				var errs []error
				ok := false
				for _, v := range s.Variants {
					m, matched := set.Match(s.Domain, v)
					switch {
					case !matched || m.Rule == nil:
						errs = append(errs, errors.New(entries(v)+": no rule"))
					case s.OnStreamDone && !m.Release:
						errs = append(errs, errors.New(entries(v)+": apply_on_stream_done descriptor is not a lease release"))
					case !s.OnStreamDone && m.Release:
						errs = append(errs, errors.New(entries(v)+": release sent before the request"))
					default:
						ok = true
					}
				}
				if !ok {
					t.Errorf("%s: %v", s.ID, errors.Join(errs...))
				}
			}
		})
	}
}

func entries(es []policy.Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(e.Key + "=" + e.Value)
	}
	return "[" + b.String() + "]"
}

// leaseHeader is the request header that marks a request the rate-limit
// filter let through (docs/algorithms/concurrency.md, envoy/website.yaml).
const leaseHeader = "x-ratelimitd-lease"

// leaseGateErrors checks the gated lease release of
// docs/algorithms/concurrency.md in every HTTP connection manager of b: each
// release (apply_on_stream_done) takes its ratelimitd.release entry from
// leaseHeader without skip_if_absent, a header_mutation filter after the
// rate-limit filter sets that header, and one before it strips client
// copies with nothing between re-adding it. releases is the number of
// release rate_limits found.
func leaseGateErrors(b *bootstrapv3.Bootstrap) (releases int, errs []error) {
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				n, e := hcmLeaseGate(&hcm)
				releases += n
				for _, err := range e {
					errs = append(errs, fmt.Errorf("listener %s: %w", l.GetName(), err))
				}
			}
		}
	}
	return releases, errs
}

func hcmLeaseGate(hcm *hcmv3.HttpConnectionManager) (releases int, errs []error) {
	check := func(where string, rls []*routev3.RateLimit) {
		for i, rl := range rls {
			if !rl.GetApplyOnStreamDone() {
				continue
			}
			releases++
			acts := rl.GetActions()
			var rh *routev3.RateLimit_Action_RequestHeaders
			if len(acts) > 0 {
				rh = acts[len(acts)-1].GetRequestHeaders()
			}
			if rh == nil || !strings.EqualFold(rh.GetHeaderName(), leaseHeader) ||
				rh.GetDescriptorKey() != policy.ReleaseKey || rh.GetSkipIfAbsent() {
				errs = append(errs, fmt.Errorf("%s rate_limits[%d]: an apply_on_stream_done release must end with request_headers {header_name: %s, descriptor_key: %s} without skip_if_absent, got %v",
					where, i, leaseHeader, policy.ReleaseKey, acts))
			}
		}
	}
	perRoute := func(where string, m map[string]*anypb.Any) {
		var per rlfilterv3.RateLimitPerRoute
		for k, a := range m {
			if a.MessageIs(&per) && a.UnmarshalTo(&per) == nil {
				check(where+" typed_per_filter_config "+k, per.GetRateLimits())
			}
		}
	}
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		check("virtual host "+vh.GetName(), vh.GetRateLimits())
		perRoute("virtual host "+vh.GetName(), vh.GetTypedPerFilterConfig())
		for ri, r := range vh.GetRoutes() {
			where := fmt.Sprintf("virtual host %s route %d", vh.GetName(), ri)
			check(where, r.GetRoute().GetRateLimits())
			perRoute(where, r.GetTypedPerFilterConfig())
		}
	}
	if releases == 0 {
		return 0, errs
	}
	filters := hcm.GetHttpFilters()
	rlAt := slices.IndexFunc(filters, func(hf *hcmv3.HttpFilter) bool { return hf.GetName() == replay.RateLimitFilterName })
	if rlAt < 0 {
		return releases, append(errs, errors.New("releases without a rate-limit filter"))
	}
	stripped, marked := false, false
	for i, hf := range filters {
		var hm hmv3.HeaderMutation
		if hf.GetTypedConfig().UnmarshalTo(&hm) != nil {
			continue
		}
		for _, m := range hm.GetMutations().GetRequestMutations() {
			removes := strings.EqualFold(m.GetRemove(), leaseHeader)
			a := m.GetAppend()
			adds := a != nil && strings.EqualFold(a.GetHeader().GetKey(), leaseHeader) && a.GetHeader().GetValue() != "" &&
				a.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS
			switch {
			case i < rlAt && removes:
				stripped = true
			case i < rlAt && a != nil && strings.EqualFold(a.GetHeader().GetKey(), leaseHeader):
				stripped = false // added back before the rate-limit filter
				errs = append(errs, fmt.Errorf("filter %d (%s) sets %s before the rate-limit filter: denied requests would release", i, hf.GetName(), leaseHeader))
			case i > rlAt && adds:
				marked = true
			case i > rlAt && removes:
				marked = false
			}
		}
	}
	if !stripped {
		errs = append(errs, fmt.Errorf("no header_mutation filter before %s removes %s: a client could forge a release for its denied request", replay.RateLimitFilterName, leaseHeader))
	}
	if !marked {
		errs = append(errs, fmt.Errorf("no header_mutation filter after %s sets %s: admitted requests would never release", replay.RateLimitFilterName, leaseHeader))
	}
	return releases, errs
}

// TestLeaseReleaseGated: every shipped Envoy file that releases concurrency
// leases gates the release on x-ratelimitd-lease (see leaseGateErrors), and
// the check rejects the ungated form, a missing strip and a marker placed
// before the rate-limit filter.
func TestLeaseReleaseGated(t *testing.T) {
	total := 0
	for name := range files {
		t.Run(name, func(t *testing.T) {
			n, errs := leaseGateErrors(decode(t, name))
			total += n
			if err := errors.Join(errs...); err != nil {
				t.Error(err)
			}
		})
	}
	if total == 0 {
		t.Fatal("no shipped file sends a lease release: the check checks nothing")
	}

	good, err := os.ReadFile("website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	marker := `                  - name: ratelimitd.lease
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
                      mutations:
                        request_mutations:
                          - append:
                              header: { key: x-ratelimitd-lease, value: "1" }
                              append_action: OVERWRITE_IF_EXISTS_OR_ADD
`
	rlFilter := "                  - name: envoy.filters.http.ratelimit\n"
	noMarker := strings.Replace(string(good), marker, "", 1)
	cases := map[string]string{
		"ungated release": strings.Replace(string(good), `                                  - request_headers:
                                      header_name: x-ratelimitd-lease
                                      descriptor_key: ratelimitd.release`,
			`                                  - generic_key: { descriptor_key: ratelimitd.release, descriptor_value: "1" }`, 1),
		"skip_if_absent": strings.Replace(string(good), "                                      descriptor_key: ratelimitd.release\n",
			"                                      descriptor_key: ratelimitd.release\n                                      skip_if_absent: true\n", 1),
		"no strip":                 strings.Replace(string(good), "                          - remove: x-ratelimitd-lease\n", "", 1),
		"no marker":                noMarker,
		"marker before the filter": strings.Replace(noMarker, rlFilter, marker+rlFilter, 1),
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			if doc == string(good) || (name == "marker before the filter" && doc == noMarker) {
				t.Fatal("replacement did not apply")
			}
			b, err := replay.DecodeBootstrap([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			if _, errs := leaseGateErrors(b); len(errs) == 0 {
				t.Error("accepted")
			}
		})
	}
}

// TestConsistentHashRing: every route of a consistent-hash edge goes to a
// RING_HASH or MAGLEV cluster with a header hash policy, the edge decides
// no limit itself, and every descriptor its shards send is keyed by a
// hashed header, so that one shard sees all the traffic of each key it
// counts. A broken edge (round robin, no hash policy, a hash on another
// header than the shards limit by) is reported.
func TestConsistentHashRing(t *testing.T) {
	for edge, shard := range ringFiles {
		t.Run(edge, func(t *testing.T) {
			if errs := ringErrors(decode(t, edge), decode(t, shard)); len(errs) > 0 {
				t.Fatal(errors.Join(errs...))
			}
			good, err := os.ReadFile(edge)
			if err != nil {
				t.Fatal(err)
			}
			for name, bad := range map[string]string{
				"round robin":  strings.Replace(string(good), "lb_policy: RING_HASH", "lb_policy: ROUND_ROBIN", 1),
				"other header": strings.Replace(string(good), "header: { header_name: x-tenant-id }", "header: { header_name: x-user }", 1),
				"no hash":      strings.Replace(string(good), "header: { header_name: x-tenant-id }", "connection_properties: { source_ip: true }", 1),
			} {
				if bad == string(good) {
					t.Fatalf("%s: replacement did not apply", name)
				}
				b, err := replay.DecodeBootstrap([]byte(bad))
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if errs := ringErrors(b, decode(t, shard)); len(errs) == 0 {
					t.Errorf("%s: no error", name)
				}
			}
		})
	}
}

// ringErrors checks a consistent-hash edge against its shard bootstrap
// (see TestConsistentHashRing).
func ringErrors(edge, shard *bootstrapv3.Bootstrap) []error {
	var errs []error
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range edge.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	hashed := map[string]bool{}
	routes := 0
	for _, hcm := range hcms(edge) {
		for _, hf := range hcm.GetHttpFilters() {
			if hf.GetName() == replay.RateLimitFilterName {
				errs = append(errs, errors.New("the edge has a rate-limit filter: its shards decide"))
			}
		}
		for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				ra := r.GetRoute()
				routes++
				c := clusters[ra.GetCluster()]
				if lb := c.GetLbPolicy(); c == nil || (lb != clusterv3.Cluster_RING_HASH && lb != clusterv3.Cluster_MAGLEV) {
					errs = append(errs, fmt.Errorf("route %q: cluster %q is not RING_HASH or MAGLEV", r.GetMatch().GetPrefix(), ra.GetCluster()))
				}
				n := 0
				for _, hp := range ra.GetHashPolicy() {
					if h := hp.GetHeader(); h != nil {
						hashed[strings.ToLower(h.GetHeaderName())] = true
						n++
					}
				}
				if n == 0 {
					errs = append(errs, fmt.Errorf("route %q: no header hash_policy", r.GetMatch().GetPrefix()))
				}
			}
		}
	}
	if routes == 0 {
		errs = append(errs, errors.New("the edge has no route"))
	}
	limited := 0
	for _, hcm := range hcms(shard) {
		for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				for i, rl := range r.GetRoute().GetRateLimits() {
					limited++
					keyed := false
					for _, a := range rl.GetActions() {
						if rh := a.GetRequestHeaders(); rh != nil && hashed[strings.ToLower(rh.GetHeaderName())] {
							keyed = true
						}
					}
					if !keyed {
						errs = append(errs, fmt.Errorf("shard route %q rate_limits[%d]: not keyed by a header the edge hashes on (%v): it would be counted per shard", r.GetMatch().GetPrefix(), i, hashed))
					}
				}
			}
		}
	}
	if limited == 0 {
		errs = append(errs, errors.New("the shard sends no descriptor"))
	}
	return errs
}

// hcms are the HTTP connection managers of b's listeners.
func hcms(b *bootstrapv3.Bootstrap) []*hcmv3.HttpConnectionManager {
	var out []*hcmv3.HttpConnectionManager
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&hcm) == nil {
					out = append(out, &hcm)
				}
			}
		}
	}
	return out
}
