package envoy_test

import (
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// rlqsFiles maps every shipped bootstrap with the rate_limit_quota filter
// (RLQS) to the ratelimitd config whose limits it enforces.
var rlqsFiles = map[string]string{
	"rlqs.yaml": "../examples/rlqs",
}

// TestRLQSBootstrap decodes every RLQS bootstrap into Envoy's protos (every
// typed_config resolved and validated), and checks what docs/rlqs.md
// promises: the filter reaches ratelimitd over HTTP/2, reports every whole
// second, allows before the first assignment, answers a denial with 429 and
// Retry-After, and every bucket id it builds matches a limited rule of the
// config, its keys in sorted order.
func TestRLQSBootstrap(t *testing.T) {
	for name, dir := range rlqsFiles {
		t.Run(name, func(t *testing.T) {
			b := decode(t, name)
			set, _, err := policy.Load(policy.LoadOptions{}, dir)
			if err != nil {
				t.Fatal(err)
			}
			clusters := map[string]*clusterv3.Cluster{}
			for _, c := range b.GetStaticResources().GetClusters() {
				clusters[c.GetName()] = c
			}
			found := 0
			for _, l := range b.GetStaticResources().GetListeners() {
				for _, fc := range l.GetFilterChains() {
					for _, f := range fc.GetFilters() {
						var hcm hcmv3.HttpConnectionManager
						if f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
							continue
						}
						for _, hf := range hcm.GetHttpFilters() {
							var q rlqsv3.RateLimitQuotaFilterConfig
							if hf.GetTypedConfig().UnmarshalTo(&q) != nil {
								continue
							}
							found++
							checkRLQS(t, &q, set, clusters)
						}
					}
				}
			}
			if found == 0 {
				t.Fatal("no rate_limit_quota filter")
			}
		})
	}
}

func checkRLQS(t *testing.T, q *rlqsv3.RateLimitQuotaFilterConfig, set *policy.Set, clusters map[string]*clusterv3.Cluster) {
	t.Helper()
	if !set.HasDomain(q.GetDomain()) {
		t.Errorf("rate_limit_quota domain %q is not a domain of the config", q.GetDomain())
	}
	name := q.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
	c, ok := clusters[name]
	if !ok {
		t.Fatalf("rlqs_server cluster %q is not defined", name)
	}
	if c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"] == nil {
		t.Errorf("cluster %s: gRPC needs HTTP/2", name)
	}
	matchers := q.GetBucketMatchers().GetMatcherList().GetMatchers()
	if len(matchers) == 0 {
		t.Fatal("no bucket matchers")
	}
	for _, m := range matchers {
		var bs rlqsv3.RateLimitQuotaBucketSettings
		if err := m.GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(&bs); err != nil {
			t.Fatalf("matcher action: %v", err)
		}
		if ri := bs.GetReportingInterval().AsDuration(); ri < time.Second || ri%time.Second != 0 {
			t.Errorf("reporting_interval %s: want whole seconds (ratelimitd's --rlqs-interval)", ri)
		}
		if bs.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL {
			t.Error("no_assignment_behavior: want ALLOW_ALL until the first assignment")
		}
		deny := bs.GetDenyResponseSettings()
		if deny.GetHttpStatus().GetCode() != 429 {
			t.Errorf("deny_response_settings http_status %v, want 429", deny.GetHttpStatus().GetCode())
		}
		if !slices.ContainsFunc(deny.GetResponseHeadersToAdd(), func(h *corev3.HeaderValueOption) bool { return h.GetHeader().GetKey() == "retry-after" }) {
			t.Error("deny_response_settings: a 429 must carry Retry-After")
		}
		// The bucket id as ratelimitd sees it, with a sample value for each
		// value taken from the request.
		var entries []policy.Entry
		for k, v := range bs.GetBucketIdBuilder().GetBucketIdBuilder() {
			val := v.GetStringValue()
			if v.GetCustomValue() != nil {
				var in matcherv3.HttpRequestHeaderMatchInput
				if err := v.GetCustomValue().GetTypedConfig().UnmarshalTo(&in); err != nil {
					t.Fatalf("custom_value: %v", err)
				}
				val = "sample-" + in.GetHeaderName()
			}
			entries = append(entries, policy.Entry{Key: k, Value: val})
		}
		slices.SortFunc(entries, func(a, b policy.Entry) int {
			if a.Key < b.Key {
				return -1
			}
			if a.Key > b.Key {
				return 1
			}
			return 0
		})
		mt, ok := set.Match(q.GetDomain(), entries)
		if !ok || mt.Rule.Unlimited {
			t.Errorf("bucket %v matches no limited rule of domain %s", entries, q.GetDomain())
		}
	}
}
