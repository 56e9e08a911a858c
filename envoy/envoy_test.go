package envoy_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	rlfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
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
	"sidecar.yaml": {"../examples/config", 1},
	"website.yaml": {"../examples/website", 0},
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
		if _, ok := files[n]; !ok {
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
				if strings.Contains(err.Error(), "not implemented") {
					t.Skip("pkg/policy is still the stub")
				}
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
