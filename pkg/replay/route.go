package replay

import (
	"fmt"
	"slices"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
)

// Route is the outcome of route matching for one request.
type Route struct {
	// VirtualHost is the name of the virtual host that matched.
	VirtualHost string
	// Index is the route's position within its virtual host.
	Index int
	// Name is the route name, or "vhost#index" when unnamed.
	Name string
	// Cluster is the routed cluster ("" for redirects, direct responses and
	// weighted clusters).
	Cluster string
	// Domain is the domain the descriptors are sent under (the filter's,
	// or a per-route override from RateLimitPerRoute.domain).
	Domain string
	// Descriptors are sent before the request is forwarded (enforced).
	Descriptors []Descriptor
	// OnStreamDone are sent when the stream of a request the rate-limit
	// filter let through completes (allowed, or its call failed open):
	// apply_on_stream_done: true, fire and forget, never enforced. Envoy
	// evaluates them in the rate-limit filter's onDestroy on the live request
	// headers, so the header_mutation filters after the rate-limit filter
	// have run on them.
	OnStreamDone []Descriptor
	// OnStreamDoneDenied are sent instead when the rate-limit filter answered
	// the request itself (over limit: a local 429 reply stops the decoder
	// filter chain, so the header_mutation filters after the rate-limit
	// filter never ran). With the gated release of
	// docs/algorithms/concurrency.md it holds no release.
	OnStreamDoneDenied []Descriptor
}

// Match routes r as Envoy would (virtual host by host, then the first
// matching route) and evaluates the rate_limits actions that apply on r,
// and the apply_on_stream_done ones also on r as the header_mutation filters
// after the rate-limit filter leave it (Route.OnStreamDone; r is not
// modified). host selects the virtual host; "" (an access log of one site
// rarely records the Host header) means the one with domain "*", else the
// first. ok is false when no route matches (Envoy answers 404 without
// calling the rate-limit service).
func (e *Envoy) Match(host string, r *Request) (Route, bool) {
	vh := e.virtualHost(host)
	if vh == nil {
		return Route{}, false
	}
	for i, rt := range vh.GetRoutes() {
		if !e.routeMatches(rt.GetMatch(), r) {
			continue
		}
		out := Route{VirtualHost: vh.GetName(), Index: i, Name: rt.GetName(), Domain: e.Domain}
		if out.Name == "" {
			out.Name = fmt.Sprintf("%s#%d", vh.GetName(), i)
		}
		ra := rt.GetRoute()
		switch {
		case ra.GetCluster() != "":
			out.Cluster = ra.GetCluster()
		case ra.GetClusterHeader() != "":
			out.Cluster, _ = r.header(ra.GetClusterHeader())
		}
		var limits []*routev3.RateLimit
		limits, out.Domain = e.routeLimits(vh, rt)
		// Stream-done descriptors of a request let through are evaluated
		// on the headers as the header_mutation filters after the
		// rate-limit filter leave them.
		passed := e.mutate(e.after, r)
		for _, rl := range limits {
			if rl.GetStage().GetValue() != e.Stage {
				continue
			}
			if !rl.GetApplyOnStreamDone() {
				if d, ok := e.descriptor(rl, r, out.Cluster); ok {
					out.Descriptors = append(out.Descriptors, d)
				}
				continue
			}
			if d, ok := e.descriptor(rl, passed, out.Cluster); ok {
				out.OnStreamDone = append(out.OnStreamDone, d)
			}
			if d, ok := e.descriptor(rl, r, out.Cluster); ok {
				out.OnStreamDoneDenied = append(out.OnStreamDoneDenied, d)
			}
		}
		return out, true
	}
	return Route{}, false
}

// routeLimits returns the rate_limits that apply on route rt of virtual
// host vh (all stages), and the domain their descriptors are sent under.
// The route's rate_limits (RouteAction.rate_limits, or
// RateLimitPerRoute.rate_limits when set) come first; the virtual host's
// follow when RateLimitPerRoute.vh_rate_limits is INCLUDE (or the
// deprecated RouteAction.include_vh_rate_limits is set), or when it is
// OVERRIDE (the default) and the route has none. The domain is the
// filter's unless RateLimitPerRoute.domain overrides it.
func (e *Envoy) routeLimits(vh *routev3.VirtualHost, rt *routev3.Route) ([]*routev3.RateLimit, string) {
	ra := rt.GetRoute()
	domain := e.Domain
	routeLimits := ra.GetRateLimits()
	vhMode := rlfilterv3.RateLimitPerRoute_OVERRIDE
	if per := e.perRoute(rt); per != nil {
		vhMode = per.GetVhRateLimits()
		if len(per.GetRateLimits()) > 0 {
			routeLimits = per.GetRateLimits()
		}
		if per.GetDomain() != "" {
			domain = per.GetDomain()
		}
	}
	limits := append([]*routev3.RateLimit(nil), routeLimits...)
	if ra.GetIncludeVhRateLimits().GetValue() || vhMode == rlfilterv3.RateLimitPerRoute_INCLUDE || //nolint:staticcheck // deprecated, still honoured by Envoy
		(vhMode == rlfilterv3.RateLimitPerRoute_OVERRIDE && len(routeLimits) == 0) {
		limits = append(limits, vh.GetRateLimits()...)
	}
	return limits, domain
}

// perRoute returns the route's RateLimitPerRoute (typed_per_filter_config
// under the rate-limit filter's name), nil when absent or not decodable.
func (e *Envoy) perRoute(rt *routev3.Route) *rlfilterv3.RateLimitPerRoute {
	a := rt.GetTypedPerFilterConfig()[e.perFilter]
	if a == nil {
		return nil
	}
	var per rlfilterv3.RateLimitPerRoute
	if !a.MessageIs(&per) || a.UnmarshalTo(&per) != nil {
		return nil
	}
	return &per
}

func (e *Envoy) virtualHost(host string) *routev3.VirtualHost {
	vhs := e.routes.GetVirtualHosts()
	if len(vhs) == 0 {
		return nil
	}
	if host == "" {
		for _, vh := range vhs {
			if slices.Contains(vh.GetDomains(), "*") {
				return vh
			}
		}
		return vhs[0]
	}
	host = strings.ToLower(host)
	// Envoy's order: exact, then longest suffix wildcard, then longest
	// prefix wildcard, then "*".
	var best *routev3.VirtualHost
	bestRank, bestLen := 0, -1
	for _, vh := range vhs {
		for _, d := range vh.GetDomains() {
			d = strings.ToLower(d)
			rank, n := 0, len(d)
			switch {
			case d == host:
				rank = 4
			case d == "*":
				rank = 1
			case strings.HasPrefix(d, "*") && strings.HasSuffix(host, d[1:]) && len(host) > len(d)-1:
				rank = 3
			case strings.HasSuffix(d, "*") && strings.HasPrefix(host, d[:len(d)-1]) && len(host) > len(d)-1:
				rank = 2
			}
			if rank > bestRank || (rank == bestRank && rank > 0 && n > bestLen) {
				best, bestRank, bestLen = vh, rank, n
			}
		}
	}
	return best
}
