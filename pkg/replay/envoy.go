package replay

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// RateLimitFilterName is the HTTP filter name of Envoy's global rate-limit
// filter (envoy.extensions.filters.http.ratelimit.v3.RateLimit).
const RateLimitFilterName = "envoy.filters.http.ratelimit"

// Envoy is the part of an Envoy bootstrap that decides which descriptors a
// request sends to the rate-limit service: the first HTTP connection manager
// (in listener order) that has an envoy.filters.http.ratelimit filter, its
// static route configuration, and that filter's settings.
type Envoy struct {
	// Domain is the filter's domain (RateLimit.domain).
	Domain string
	// Stage is the filter's stage; only route rate_limits with the same
	// stage apply.
	Stage uint32
	// ServiceCluster is node.cluster, the value of source_cluster.
	ServiceCluster string
	// Listener is the name of the listener holding the filter.
	Listener string
	// XFFNumTrustedHops is the HTTP connection manager's
	// xff_num_trusted_hops, copied for documentation only: a log has no
	// X-Forwarded-For, so the log's client is the remote address.
	XFFNumTrustedHops uint32
	// UseRemoteAddress is the HTTP connection manager's
	// use_remote_address, copied for documentation only (see
	// XFFNumTrustedHops).
	UseRemoteAddress bool

	routes    *routev3.RouteConfiguration
	regexps   map[string]*regexp.Regexp
	perFilter string // filter name under which typed_per_filter_config is read

	// after holds the header_mutation filters placed between the rate-limit
	// filter and the router, in chain order: they run only on requests the
	// rate-limit filter let through. (Filters before it are reflected in
	// Request by the caller; see Request.)
	after []headerMutationFilter
}

// LoadEnvoy reads an Envoy bootstrap file (see DecodeBootstrap) and extracts
// what Descriptors needs. Errors: no HTTP connection manager with the
// rate-limit filter, routes not static (RDS), rate_limits actions this
// package cannot reproduce (metadata, extension, dynamic_metadata,
// remote_address_match), header_mutation filters after the rate-limit filter
// it cannot reproduce (query_parameter_mutations, formatters, pseudo-headers,
// per-route HeaderMutationPerRoute), or a regex Go's RE2 engine rejects.
func LoadEnvoy(path string) (*Envoy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	b, err := DecodeBootstrap(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	e, err := NewEnvoy(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}

// NewEnvoy extracts the rate-limit view of a decoded bootstrap (see LoadEnvoy).
func NewEnvoy(b *bootstrapv3.Bootstrap) (*Envoy, error) {
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				e, ok, err := fromNetworkFilter(b, f)
				if err != nil {
					return nil, fmt.Errorf("replay: listener %s: %w", l.GetName(), err)
				}
				if ok {
					e.Listener = l.GetName()
					return e, nil
				}
			}
		}
	}
	return nil, errors.New("replay: no http_connection_manager with an envoy.filters.http.ratelimit filter in static listeners")
}

// fromNetworkFilter extracts the rate-limit view of one network filter of
// a listener of b. ok is false, with no error, when f is not an HTTP
// connection manager with a rate-limit filter; the error is for one that
// cannot be replayed. Listener is left for the caller to set.
func fromNetworkFilter(b *bootstrapv3.Bootstrap, f *listenerv3.Filter) (e *Envoy, ok bool, err error) {
	var hcm hcmv3.HttpConnectionManager
	if f.GetTypedConfig() == nil || !f.GetTypedConfig().MessageIs(&hcm) {
		return nil, false, nil
	}
	if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		return nil, false, err
	}
	filters := hcm.GetHttpFilters()
	rlAt := slices.IndexFunc(filters, func(hf *hcmv3.HttpFilter) bool {
		return hf.GetTypedConfig() != nil && hf.GetTypedConfig().MessageIs(&rlfilterv3.RateLimit{})
	})
	if rlAt < 0 {
		return nil, false, nil
	}
	hf := filters[rlAt]
	var rl rlfilterv3.RateLimit
	if err := hf.GetTypedConfig().UnmarshalTo(&rl); err != nil {
		return nil, false, err
	}
	rc := hcm.GetRouteConfig()
	if rc == nil {
		return nil, false, errors.New("only a static route_config can be replayed (not RDS or scoped routes)")
	}
	if len(rl.GetRateLimits()) > 0 {
		return nil, false, errors.New("filter-level rate_limits are not supported; put actions on routes")
	}
	e = &Envoy{
		Domain:            rl.GetDomain(),
		Stage:             rl.GetStage(),
		ServiceCluster:    b.GetNode().GetCluster(),
		XFFNumTrustedHops: hcm.GetXffNumTrustedHops(),
		UseRemoteAddress:  hcm.GetUseRemoteAddress().GetValue(),
		routes:            rc,
		regexps:           map[string]*regexp.Regexp{},
		perFilter:         hf.GetName(),
	}
	if err := e.compileFilters(filters, rlAt); err != nil {
		return nil, false, err
	}
	if err := e.compile(); err != nil {
		return nil, false, err
	}
	return e, true, nil
}

// compileFilters records the header_mutation filters after the rate-limit
// filter (filters[rlAt]); see headerMutationFilter. Those before it are not
// applied (Request is what the rate-limit filter sees) and other filter types
// are not simulated.
func (e *Envoy) compileFilters(filters []*hcmv3.HttpFilter, rlAt int) error {
	var errs []error
	for _, hf := range filters[rlAt+1:] {
		hm, ok, err := e.compileHeaderMutation(hf)
		switch {
		case err != nil:
			errs = append(errs, err)
		case ok:
			e.after = append(e.after, hm)
		}
	}
	if len(e.after) > 0 {
		if err := checkNoPerRouteHeaderMutation(e.routes); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
