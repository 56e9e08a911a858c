package k8s_test

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// decodeEnvoy decodes a patch value (JSON from YAML) into an Envoy proto,
// rejecting unknown fields and unresolvable Any types, then runs the
// proto's validation rules.
// complete, when not nil, fills the fields Istio supplies around a MERGE
// fragment (a virtual host's name and domains, a route's match and
// cluster) before validation; it must not touch fields the patch sets.
func decodeEnvoy(t *testing.T, what string, js []byte, m proto.Message, complete ...func()) {
	t.Helper()
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, m); err != nil {
		t.Fatalf("%s: decode %s: %v", what, m.ProtoReflect().Descriptor().FullName(), err)
	}
	for _, c := range complete {
		c()
	}
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			t.Errorf("%s: %s: %v", what, m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
}

// istioPatches returns every config patch of the rendered Istio EnvoyFilters.
func istioPatches(t *testing.T) []envoyConfigPatch {
	t.Helper()
	r := render(t, "istio")
	var out []envoyConfigPatch
	for _, ef := range byKind[envoyFilter](r, "networking.istio.io/v1alpha3/EnvoyFilter") {
		if ef.Spec.WorkloadSelector == nil || len(ef.Spec.WorkloadSelector.Labels) == 0 {
			t.Errorf("EnvoyFilter %s: no workloadSelector: it would patch every proxy in its namespace", ef.Metadata.Name)
		}
		out = append(out, ef.Spec.ConfigPatches...)
	}
	if len(out) == 0 {
		t.Fatal("no EnvoyFilter config patches")
	}
	return out
}

// serviceClusterName is the cluster Istio creates for a Service port:
// outbound|<port>||<service>.<namespace>.svc.cluster.local.
func serviceClusterName(t *testing.T) (cluster, authority string) {
	t.Helper()
	r := render(t, "base")
	svcs := byName[corev1.Service](r, "v1/Service", "ratelimitd")
	if len(svcs) != 1 {
		t.Fatal("no Service ratelimitd in the base")
	}
	svc := svcs[0]
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			if p.AppProtocol == nil || (*p.AppProtocol != "grpc" && *p.AppProtocol != "kubernetes.io/h2c") {
				t.Errorf("Service port grpc: appProtocol %v; Istio needs grpc or kubernetes.io/h2c to speak HTTP/2", p.AppProtocol)
			}
			host := fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, svc.Namespace)
			return fmt.Sprintf("outbound|%d||%s", p.Port, host), host
		}
	}
	t.Fatal("Service ratelimitd has no port named grpc")
	return "", ""
}

// loadExampleConfig loads the config the ConfigMap ships.
func loadExampleConfig(t *testing.T) *policy.Set {
	t.Helper()
	set, _, err := policy.Load(policy.LoadOptions{}, "base/config")
	if err != nil {
		t.Fatalf("policy.Load(base/config): %v", err)
	}
	return set
}

// TestIstioRateLimitFilter decodes the HTTP_FILTER patch as an Envoy
// HttpFilter whose typed_config is the rate-limit filter, validates both,
// and checks it points at the ratelimitd Service with a domain of the
// shipped config.
func TestIstioRateLimitFilter(t *testing.T) {
	cluster, authority := serviceClusterName(t)
	set := loadExampleConfig(t)
	found := 0
	for _, p := range istioPatches(t) {
		if p.ApplyTo != "HTTP_FILTER" {
			continue
		}
		found++
		if p.Patch.Operation != "INSERT_BEFORE" || p.Match.Listener == nil || p.Match.Listener.FilterChain.Filter.SubFilter == nil ||
			p.Match.Listener.FilterChain.Filter.SubFilter.Name != "envoy.filters.http.router" {
			t.Errorf("HTTP_FILTER patch must be inserted before envoy.filters.http.router (the router must stay last)")
		}
		var hf hcmv3.HttpFilter
		decodeEnvoy(t, "HTTP_FILTER patch", p.Patch.Value, &hf)
		if hf.GetName() != "envoy.filters.http.ratelimit" {
			t.Errorf("filter name %q, want envoy.filters.http.ratelimit", hf.GetName())
		}
		var rl ratelimitv3.RateLimit
		if err := hf.GetTypedConfig().UnmarshalTo(&rl); err != nil {
			t.Fatalf("typed_config is not envoy.extensions.filters.http.ratelimit.v3.RateLimit: %v", err)
		}
		if err := rl.ValidateAll(); err != nil {
			t.Errorf("RateLimit: %v", err)
		}
		if !set.HasDomain(rl.GetDomain()) {
			t.Errorf("filter domain %q is not a domain of the shipped config %v", rl.GetDomain(), set.Domains())
		}
		rls := rl.GetRateLimitService()
		if rls.GetTransportApiVersion() != corev3.ApiVersion_V3 {
			t.Errorf("rate_limit_service.transport_api_version must be V3")
		}
		eg := rls.GetGrpcService().GetEnvoyGrpc()
		if eg.GetClusterName() != cluster {
			t.Errorf("cluster_name %q, want %q (the ratelimitd Service's grpc port)", eg.GetClusterName(), cluster)
		}
		if a := eg.GetAuthority(); a != "" && a != authority {
			t.Errorf("authority %q, want %q", a, authority)
		}
		if rl.GetFailureModeDeny() {
			t.Errorf("failure_mode_deny: an unreachable ratelimitd should not take the site down")
		}
		if rl.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_OFF {
			t.Errorf("enable_x_ratelimit_headers must be OFF: ratelimitd sends the IETF RateLimit headers itself")
		}
	}
	if found != 1 {
		t.Errorf("%d HTTP_FILTER patches, want 1", found)
	}
}

// request is a sample client request the action evaluator reads.
type request struct {
	remote  string
	headers map[string]string
}

// Sample requests for the descriptor check: together they must reach every
// rule of the shipped config through the actions.
var samples = []request{
	{"203.0.113.7", map[string]string{":path": "/api/v1/users", ":method": "GET", "x-plan": "free", "x-api-key": "k-123"}},
	{"2001:db8::1", map[string]string{":path": "/search", ":method": "GET", "x-plan": "internal", "x-api-key": "k-456", "x-tenant-id": "acme"}},
	{"198.51.100.2", map[string]string{":path": "/login", ":method": "POST", "x-login-user": "alice"}},
}

// descriptorOf evaluates a rate_limits entry's actions as Envoy's router
// does: every action must produce an entry, else the entry yields no
// descriptor. Only the actions used here are implemented; any other fails
// the test.
func descriptorOf(t *testing.T, rl *routev3.RateLimit, req request) ([]policy.Entry, bool) {
	t.Helper()
	var out []policy.Entry
	for _, a := range rl.GetActions() {
		switch x := a.GetActionSpecifier().(type) {
		case *routev3.RateLimit_Action_RemoteAddress_:
			if net.ParseIP(req.remote) == nil {
				t.Fatalf("sample remote %q", req.remote)
			}
			out = append(out, policy.Entry{Key: "remote_address", Value: req.remote})
		case *routev3.RateLimit_Action_RequestHeaders_:
			v, ok := req.headers[strings.ToLower(x.RequestHeaders.GetHeaderName())]
			if !ok {
				if x.RequestHeaders.GetSkipIfAbsent() {
					continue
				}
				return nil, false
			}
			out = append(out, policy.Entry{Key: x.RequestHeaders.GetDescriptorKey(), Value: v})
		case *routev3.RateLimit_Action_GenericKey_:
			k := x.GenericKey.GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			out = append(out, policy.Entry{Key: k, Value: x.GenericKey.GetDescriptorValue()})
		case *routev3.RateLimit_Action_HeaderValueMatch_:
			hv := x.HeaderValueMatch
			all := true
			for _, h := range hv.GetHeaders() {
				v, ok := req.headers[h.GetName()]
				sm := h.GetStringMatch()
				var m bool
				switch {
				case !ok:
				case sm.GetSafeRegex() != nil:
					m = regexp.MustCompile("^(?:" + sm.GetSafeRegex().GetRegex() + ")$").MatchString(v)
				case sm.GetExact() != "":
					m = v == sm.GetExact()
				case sm.GetPrefix() != "":
					m = strings.HasPrefix(v, sm.GetPrefix())
				default:
					t.Fatalf("header_value_match %s: matcher not implemented in this test", h.GetName())
				}
				all = all && m != h.GetInvertMatch()
			}
			expect := hv.GetExpectMatch() == nil || hv.GetExpectMatch().GetValue()
			if all != expect {
				return nil, false
			}
			k := hv.GetDescriptorKey()
			if k == "" {
				k = "header_match"
			}
			out = append(out, policy.Entry{Key: k, Value: hv.GetDescriptorValue()})
		default:
			t.Fatalf("action %T is not implemented in this test's evaluator", x)
		}
	}
	return out, len(out) > 0
}

// TestIstioRateLimitActions decodes every route-level patch into Envoy's
// VirtualHost or Route, validates each RateLimit, and checks that the
// descriptors the actions produce for the sample requests reach every rule
// of the shipped config, and that every action list reaches some rule.
func TestIstioRateLimitActions(t *testing.T) {
	set := loadExampleConfig(t)
	var domain string
	for _, p := range istioPatches(t) {
		if p.ApplyTo == "HTTP_FILTER" {
			var hf hcmv3.HttpFilter
			var rl ratelimitv3.RateLimit
			decodeEnvoy(t, "filter", p.Patch.Value, &hf)
			if err := hf.GetTypedConfig().UnmarshalTo(&rl); err == nil {
				domain = rl.GetDomain()
			}
		}
	}
	if domain == "" {
		t.Fatal("no rate-limit filter domain")
	}

	var lists []*routev3.RateLimit
	for i, p := range istioPatches(t) {
		what := fmt.Sprintf("patch %d (%s)", i, p.ApplyTo)
		switch p.ApplyTo {
		case "HTTP_FILTER":
			continue
		case "VIRTUAL_HOST":
			var vh routev3.VirtualHost
			decodeEnvoy(t, what, p.Patch.Value, &vh, func() {
				if vh.Name != "" || len(vh.Domains) > 0 {
					t.Errorf("%s: the patch sets the virtual host's name or domains; Istio owns them", what)
				}
				vh.Name, vh.Domains = "istio-owned", []string{"*"}
			})
			lists = append(lists, vh.GetRateLimits()...)
		case "HTTP_ROUTE":
			if p.Match.RouteConfiguration == nil || p.Match.RouteConfiguration.Vhost.Route == nil || p.Match.RouteConfiguration.Vhost.Route.Name == "" {
				t.Errorf("%s: match a named route, or the patch lands on every route", what)
			}
			var rt routev3.Route
			decodeEnvoy(t, what, p.Patch.Value, &rt, func() {
				if rt.Match != nil || rt.GetRoute().GetClusterSpecifier() != nil {
					t.Errorf("%s: the patch sets the route's match or cluster; the VirtualService owns them", what)
				}
				rt.Match = &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
				if rt.GetRoute() != nil {
					rt.GetRoute().ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: "istio-owned"}
				}
			})
			lists = append(lists, rt.GetRoute().GetRateLimits()...)
			for name, a := range rt.GetTypedPerFilterConfig() {
				var per ratelimitv3.RateLimitPerRoute
				if err := a.UnmarshalTo(&per); err != nil {
					t.Errorf("%s: typed_per_filter_config[%s]: %v", what, name, err)
					continue
				}
				if err := per.ValidateAll(); err != nil {
					t.Errorf("%s: RateLimitPerRoute: %v", what, err)
				}
				if d := per.GetDomain(); d != "" && !set.HasDomain(d) {
					t.Errorf("%s: per-route domain %q is not in the config", what, d)
				}
			}
		default:
			t.Errorf("%s: unexpected applyTo", what)
		}
		if p.Patch.Operation != "MERGE" {
			t.Errorf("%s: operation %s, want MERGE (keep Istio's routes)", what, p.Patch.Operation)
		}
	}
	if len(lists) == 0 {
		t.Fatal("no rate_limits actions")
	}
	reached := map[*policy.Rule]bool{}
	for i, rl := range lists {
		if err := rl.ValidateAll(); err != nil {
			t.Errorf("rate_limits[%d]: %v", i, err)
		}
		hit := false
		for _, req := range samples {
			entries, ok := descriptorOf(t, rl, req)
			if !ok {
				continue
			}
			if m, ok := set.Match(domain, entries); ok {
				hit = true
				reached[m.Rule] = true
			}
		}
		if !hit {
			t.Errorf("rate_limits[%d] (%v) reaches no rule of domain %q for any sample request", i, rl.GetActions(), domain)
		}
	}
	for _, r := range set.Rules() {
		if r.Domain == domain && !reached[r] {
			t.Errorf("rule %s (%s:%d) is reached by no Istio action (or no sample request)", r.Path, r.File, r.Line)
		}
	}
	if !slices.Contains(set.Domains(), domain) {
		t.Errorf("domain %q not loaded", domain)
	}
}
