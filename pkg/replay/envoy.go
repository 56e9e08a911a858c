package replay

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// RateLimitFilterName is the HTTP filter name of Envoy's global rate-limit
// filter (envoy.extensions.filters.http.ratelimit.v3.RateLimit).
const RateLimitFilterName = "envoy.filters.http.ratelimit"

// DecodeBootstrap decodes an Envoy v3 bootstrap written in YAML (or JSON)
// into the go-control-plane Bootstrap proto and runs its generated
// ValidateAll. YAML is converted to JSON and decoded with protojson, which
// rejects unknown fields and resolves every typed_config Any through the
// protobuf registry: an extension type this package does not link in is an
// error, as it would be for Envoy.
func DecodeBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("replay: envoy yaml: %w", err)
	}
	js, err := json.Marshal(jsonable(doc))
	if err != nil {
		return nil, fmt.Errorf("replay: envoy yaml to json: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return nil, fmt.Errorf("replay: envoy bootstrap: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("replay: envoy bootstrap invalid: %w", err)
	}
	if err := validateAnys(b.ProtoReflect(), "bootstrap"); err != nil {
		return nil, fmt.Errorf("replay: envoy bootstrap invalid: %w", err)
	}
	return &b, nil
}

// validateAnys runs ValidateAll on the message inside every Any (the
// generated ValidateAll stops at an Any) and recurses into it, so that
// typed_config contents (HTTP connection manager, routes, filters) are
// checked too.
func validateAnys(m protoreflect.Message, path string) error {
	var errs []error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		visit := func(x protoreflect.Message, p string) {
			if a, ok := x.Interface().(*anypb.Any); ok {
				inner, err := a.UnmarshalNew()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", p, err))
					return
				}
				if va, ok := inner.(interface{ ValidateAll() error }); ok {
					if err := va.ValidateAll(); err != nil {
						errs = append(errs, fmt.Errorf("%s (%s): %w", p, a.GetTypeUrl(), err))
					}
				}
				if err := validateAnys(inner.ProtoReflect(), p); err != nil {
					errs = append(errs, err)
				}
				return
			}
			if err := validateAnys(x, p); err != nil {
				errs = append(errs, err)
			}
		}
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				visit(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(mv.Message(), fmt.Sprintf("%s[%v]", p, k.Interface()))
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			visit(v.Message(), p)
		}
		return true
	})
	return errors.Join(errs...)
}

// jsonable turns yaml.v3's decoded values into values encoding/json accepts
// (maps with non-string keys are stringified).
func jsonable(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = jsonable(x)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[fmt.Sprint(k)] = jsonable(x)
		}
		return m
	case []any:
		for i, x := range t {
			t[i] = jsonable(x)
		}
		return t
	default:
		return v
	}
}

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
	// XFFNumTrustedHops and UseRemoteAddress are copied from the HTTP
	// connection manager (documentation only: a log has no
	// X-Forwarded-For, so the log's client is the remote address).
	XFFNumTrustedHops uint32
	UseRemoteAddress  bool

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
				if f.GetTypedConfig() == nil {
					continue
				}
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig().MessageIs(&hcm) {
					if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
						return nil, fmt.Errorf("replay: listener %s: %w", l.GetName(), err)
					}
				} else {
					continue
				}
				filters := hcm.GetHttpFilters()
				rlAt := slices.IndexFunc(filters, func(hf *hcmv3.HttpFilter) bool {
					return hf.GetTypedConfig() != nil && hf.GetTypedConfig().MessageIs(&rlfilterv3.RateLimit{})
				})
				if rlAt < 0 {
					continue
				}
				hf := filters[rlAt]
				var rl rlfilterv3.RateLimit
				if err := hf.GetTypedConfig().UnmarshalTo(&rl); err != nil {
					return nil, fmt.Errorf("replay: listener %s: %w", l.GetName(), err)
				}
				rc := hcm.GetRouteConfig()
				if rc == nil {
					return nil, fmt.Errorf("replay: listener %s: only a static route_config can be replayed (not RDS or scoped routes)", l.GetName())
				}
				if len(rl.GetRateLimits()) > 0 {
					return nil, fmt.Errorf("replay: listener %s: filter-level rate_limits are not supported; put actions on routes", l.GetName())
				}
				e := &Envoy{
					Domain:            rl.GetDomain(),
					Stage:             rl.GetStage(),
					ServiceCluster:    b.GetNode().GetCluster(),
					Listener:          l.GetName(),
					XFFNumTrustedHops: hcm.GetXffNumTrustedHops(),
					UseRemoteAddress:  hcm.GetUseRemoteAddress().GetValue(),
					routes:            rc,
					regexps:           map[string]*regexp.Regexp{},
					perFilter:         hf.GetName(),
				}
				if err := e.compileFilters(filters, rlAt); err != nil {
					return nil, fmt.Errorf("replay: listener %s: %w", l.GetName(), err)
				}
				if err := e.compile(); err != nil {
					return nil, fmt.Errorf("replay: listener %s: %w", l.GetName(), err)
				}
				return e, nil
			}
		}
	}
	return nil, errors.New("replay: no http_connection_manager with an envoy.filters.http.ratelimit filter in static listeners")
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

// compile checks every action is reproducible and precompiles regexes.
func (e *Envoy) compile() error {
	var errs []error
	checkLimits := func(where string, rls []*routev3.RateLimit) {
		for i, rl := range rls {
			for j, a := range rl.GetActions() {
				if err := e.compileAction(a); err != nil {
					errs = append(errs, fmt.Errorf("%s rate_limits[%d].actions[%d]: %w", where, i, j, err))
				}
			}
		}
	}
	for _, vh := range e.routes.GetVirtualHosts() {
		checkLimits("virtual host "+vh.GetName(), vh.GetRateLimits())
		for ri, r := range vh.GetRoutes() {
			where := fmt.Sprintf("virtual host %s route %d", vh.GetName(), ri)
			m := r.GetMatch()
			if re := m.GetSafeRegex(); re != nil {
				if err := e.addRegexp(re.GetRegex()); err != nil {
					errs = append(errs, fmt.Errorf("%s match: %w", where, err))
				}
			}
			if m.GetConnectMatcher() != nil || m.GetPathMatchPolicy() != nil {
				errs = append(errs, fmt.Errorf("%s match: connect_matcher and path_match_policy are not supported", where))
			}
			for _, h := range m.GetHeaders() {
				if err := e.compileHeader(h); err != nil {
					errs = append(errs, fmt.Errorf("%s match: %w", where, err))
				}
			}
			for _, q := range m.GetQueryParameters() {
				if err := e.compileString(q.GetStringMatch()); err != nil {
					errs = append(errs, fmt.Errorf("%s match: %w", where, err))
				}
			}
			if ra := r.GetRoute(); ra != nil {
				checkLimits(where, ra.GetRateLimits())
			}
		}
	}
	return errors.Join(errs...)
}

func (e *Envoy) addRegexp(re string) error {
	if _, ok := e.regexps[re]; ok {
		return nil
	}
	c, err := regexp.Compile(`^(?:` + re + `)$`)
	if err != nil {
		return fmt.Errorf("regex %q: %w", re, err)
	}
	e.regexps[re] = c
	return nil
}

func (e *Envoy) compileString(sm *matcherv3.StringMatcher) error {
	if sm == nil {
		return nil
	}
	if re := sm.GetSafeRegex(); re != nil {
		return e.addRegexp(re.GetRegex())
	}
	if sm.GetCustom() != nil {
		return errors.New("custom string matchers are not supported")
	}
	return nil
}

func (e *Envoy) compileHeader(h *routev3.HeaderMatcher) error {
	if h.GetRangeMatch() != nil {
		return errors.New("range_match header matchers are not supported")
	}
	if re := h.GetSafeRegexMatch(); re != nil { //nolint:staticcheck // deprecated fields still occur in deployed configs
		return e.addRegexp(re.GetRegex())
	}
	return e.compileString(h.GetStringMatch())
}

func (e *Envoy) compileAction(a *routev3.RateLimit_Action) error {
	switch s := a.GetActionSpecifier().(type) {
	case *routev3.RateLimit_Action_SourceCluster_, *routev3.RateLimit_Action_DestinationCluster_,
		*routev3.RateLimit_Action_RequestHeaders_, *routev3.RateLimit_Action_QueryParameters_,
		*routev3.RateLimit_Action_RemoteAddress_, *routev3.RateLimit_Action_MaskedRemoteAddress_:
		return nil
	case *routev3.RateLimit_Action_GenericKey_:
		if strings.Contains(s.GenericKey.GetDescriptorValue(), "%") {
			return errors.New("generic_key formatters (%...%) are not supported")
		}
		return nil
	case *routev3.RateLimit_Action_HeaderValueMatch_:
		for _, h := range s.HeaderValueMatch.GetHeaders() {
			if err := e.compileHeader(h); err != nil {
				return err
			}
		}
		return nil
	case *routev3.RateLimit_Action_QueryParameterValueMatch_:
		for _, q := range s.QueryParameterValueMatch.GetQueryParameters() {
			if err := e.compileString(q.GetStringMatch()); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("action %T cannot be replayed from an access log", s)
	}
}

// Request is what a log line tells about one HTTP request, as Envoy's
// rate-limit filter would see it: the filters before it (a header_mutation
// that strips client copies of a header, an ext_authz that adds one) are
// the caller's to reflect; Match applies only the header_mutation filters
// after it.
type Request struct {
	// Client is the downstream address (remote_address).
	Client netip.Addr
	Method string
	// Path is the request target as sent (:path, with query string).
	Path string
	// Headers holds lower-case header names to values (e.g. "user-agent",
	// "referer", ":authority"); only what the log records.
	Headers map[string]string
}

// header returns a request header, including the pseudo-headers :path,
// :method and :authority (alias host).
func (r *Request) header(name string) (string, bool) {
	switch name = strings.ToLower(name); name {
	case ":path":
		return r.Path, true
	case ":method":
		return r.Method, r.Method != ""
	case "host":
		name = ":authority"
	}
	v, ok := r.Headers[name]
	return v, ok
}

func (r *Request) query() url.Values {
	_, q, ok := strings.Cut(r.Path, "?")
	if !ok {
		return nil
	}
	v, _ := url.ParseQuery(q)
	return v
}

func (r *Request) pathNoQuery() string {
	p, _, _ := strings.Cut(r.Path, "?")
	return p
}

// Descriptor is one rate-limit descriptor Envoy would send.
type Descriptor struct {
	Entries []policy.Entry
	// HitsAddend is the route rate_limit's hits_addend.number (0 = unset:
	// the service uses 1).
	HitsAddend uint64
}

// Route is the outcome of route matching for one request.
type Route struct {
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
// modified). host
// selects the virtual host; "" (an access log of one site rarely records
// the Host header) means the virtual host with domain "*", else the first
// one. ok is false when no route
// matches (Envoy answers 404 without calling the rate-limit service).
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
		var routeLimits []*routev3.RateLimit
		if ra != nil {
			routeLimits = ra.GetRateLimits()
		}
		vhMode := rlfilterv3.RateLimitPerRoute_OVERRIDE
		if per := e.perRoute(rt); per != nil {
			vhMode = per.GetVhRateLimits()
			if len(per.GetRateLimits()) > 0 {
				routeLimits = per.GetRateLimits()
			}
			if per.GetDomain() != "" {
				out.Domain = per.GetDomain()
			}
		}
		limits := append([]*routev3.RateLimit(nil), routeLimits...)
		switch {
		case ra.GetIncludeVhRateLimits().GetValue() || vhMode == rlfilterv3.RateLimitPerRoute_INCLUDE: //nolint:staticcheck // deprecated, still honoured by Envoy
			limits = append(limits, vh.GetRateLimits()...)
		case vhMode == rlfilterv3.RateLimitPerRoute_OVERRIDE && len(routeLimits) == 0:
			limits = append(limits, vh.GetRateLimits()...)
		}
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

func (e *Envoy) routeMatches(m *routev3.RouteMatch, r *Request) bool {
	caseSensitive := m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()
	eq := func(a, b string) bool {
		if caseSensitive {
			return a == b
		}
		return strings.EqualFold(a, b)
	}
	hasPrefix := func(s, p string) bool {
		return len(s) >= len(p) && eq(s[:len(p)], p)
	}
	path := r.pathNoQuery()
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		if !hasPrefix(r.Path, ps.Prefix) {
			return false
		}
	case *routev3.RouteMatch_Path:
		if !eq(path, ps.Path) {
			return false
		}
	case *routev3.RouteMatch_SafeRegex:
		if !e.regexps[ps.SafeRegex.GetRegex()].MatchString(path) {
			return false
		}
	case *routev3.RouteMatch_PathSeparatedPrefix:
		p := ps.PathSeparatedPrefix
		if !hasPrefix(path, p) || (len(path) > len(p) && path[len(p)] != '/') {
			return false
		}
	default:
		return false
	}
	for _, h := range m.GetHeaders() {
		if !e.headerMatches(h, r) {
			return false
		}
	}
	if qps := m.GetQueryParameters(); len(qps) > 0 {
		q := r.query()
		for _, qp := range qps {
			vs, ok := q[qp.GetName()]
			switch {
			case qp.GetPresentMatch():
				if !ok {
					return false
				}
			case qp.GetStringMatch() != nil:
				if !ok || !e.stringMatches(qp.GetStringMatch(), vs[0]) {
					return false
				}
			}
		}
	}
	return true
}

func (e *Envoy) stringMatches(sm *matcherv3.StringMatcher, v string) bool {
	ic := sm.GetIgnoreCase()
	fold := func(s string) string {
		if ic {
			return strings.ToLower(s)
		}
		return s
	}
	switch p := sm.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(v) == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		return e.regexps[p.SafeRegex.GetRegex()].MatchString(v)
	}
	return false
}

// headerMatches implements config.route.v3.HeaderMatcher on the headers a
// log records (plus :path and :method). The deprecated direct matchers
// (exact_match, prefix_match, ...) are still honoured, as by Envoy.
//
//nolint:staticcheck // deprecated fields still occur in deployed configs
func (e *Envoy) headerMatches(h *routev3.HeaderMatcher, r *Request) bool {
	v, ok := r.header(h.GetName())
	if !ok && h.GetTreatMissingHeaderAsEmpty() {
		v, ok = "", true
	}
	var m bool
	switch s := h.GetHeaderMatchSpecifier().(type) {
	case nil:
		m = ok
	case *routev3.HeaderMatcher_PresentMatch:
		m = ok == s.PresentMatch
	case *routev3.HeaderMatcher_ExactMatch:
		m = ok && v == s.ExactMatch
	case *routev3.HeaderMatcher_PrefixMatch:
		m = ok && strings.HasPrefix(v, s.PrefixMatch)
	case *routev3.HeaderMatcher_SuffixMatch:
		m = ok && strings.HasSuffix(v, s.SuffixMatch)
	case *routev3.HeaderMatcher_ContainsMatch:
		m = ok && strings.Contains(v, s.ContainsMatch)
	case *routev3.HeaderMatcher_SafeRegexMatch:
		m = ok && e.regexps[s.SafeRegexMatch.GetRegex()].MatchString(v)
	case *routev3.HeaderMatcher_StringMatch:
		m = ok && e.stringMatches(s.StringMatch, v)
	}
	if !ok {
		// Envoy: a missing header never matches, inverted or not (unless
		// present_match: false).
		if _, pm := h.GetHeaderMatchSpecifier().(*routev3.HeaderMatcher_PresentMatch); !pm {
			return false
		}
	}
	return m != h.GetInvertMatch()
}

// descriptor evaluates one route rate_limit's actions in order. ok is false
// when an action yields nothing: Envoy then sends no descriptor for this
// rate_limit (request_headers and query_parameters with skip_if_absent only
// drop their own entry).
func (e *Envoy) descriptor(rl *routev3.RateLimit, r *Request, cluster string) (Descriptor, bool) {
	d := Descriptor{HitsAddend: rl.GetHitsAddend().GetNumber().GetValue()}
	add := func(k, v string) { d.Entries = append(d.Entries, policy.Entry{Key: k, Value: v}) }
	for _, a := range rl.GetActions() {
		switch s := a.GetActionSpecifier().(type) {
		case *routev3.RateLimit_Action_SourceCluster_:
			add("source_cluster", e.ServiceCluster)
		case *routev3.RateLimit_Action_DestinationCluster_:
			if cluster == "" {
				return Descriptor{}, false
			}
			add("destination_cluster", cluster)
		case *routev3.RateLimit_Action_RequestHeaders_:
			v, ok := r.header(s.RequestHeaders.GetHeaderName())
			if !ok {
				if s.RequestHeaders.GetSkipIfAbsent() {
					continue
				}
				return Descriptor{}, false
			}
			add(s.RequestHeaders.GetDescriptorKey(), v)
		case *routev3.RateLimit_Action_QueryParameters_:
			vs, ok := r.query()[s.QueryParameters.GetQueryParameterName()]
			if !ok {
				if s.QueryParameters.GetSkipIfAbsent() {
					continue
				}
				return Descriptor{}, false
			}
			add(s.QueryParameters.GetDescriptorKey(), vs[0])
		case *routev3.RateLimit_Action_RemoteAddress_:
			if !r.Client.IsValid() {
				return Descriptor{}, false
			}
			add("remote_address", r.Client.String())
		case *routev3.RateLimit_Action_MaskedRemoteAddress_:
			v, ok := MaskedRemoteAddress(r.Client, s.MaskedRemoteAddress)
			if !ok {
				return Descriptor{}, false
			}
			add("masked_remote_address", v)
		case *routev3.RateLimit_Action_GenericKey_:
			k := s.GenericKey.GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			add(k, s.GenericKey.GetDescriptorValue())
		case *routev3.RateLimit_Action_HeaderValueMatch_:
			hv := s.HeaderValueMatch
			all := true
			for _, h := range hv.GetHeaders() {
				if !e.headerMatches(h, r) {
					all = false
					break
				}
			}
			expect := hv.GetExpectMatch() == nil || hv.GetExpectMatch().GetValue()
			k := hv.GetDescriptorKey()
			if k == "" {
				k = "header_match"
			}
			switch {
			case all == expect:
				add(k, hv.GetDescriptorValue())
			case hv.GetDefaultValue() != "":
				add(k, hv.GetDefaultValue())
			default:
				return Descriptor{}, false
			}
		case *routev3.RateLimit_Action_QueryParameterValueMatch_:
			qv := s.QueryParameterValueMatch
			q := r.query()
			all := true
			for _, qp := range qv.GetQueryParameters() {
				vs, ok := q[qp.GetName()]
				if qp.GetPresentMatch() {
					all = all && ok
				} else if qp.GetStringMatch() != nil {
					all = all && ok && e.stringMatches(qp.GetStringMatch(), vs[0])
				}
			}
			expect := qv.GetExpectMatch() == nil || qv.GetExpectMatch().GetValue()
			k := qv.GetDescriptorKey()
			if k == "" {
				k = "query_match"
			}
			if all != expect {
				return Descriptor{}, false
			}
			add(k, qv.GetDescriptorValue())
		default:
			return Descriptor{}, false
		}
	}
	if len(d.Entries) == 0 {
		return Descriptor{}, false
	}
	return d, true
}

// MaskedRemoteAddress renders addr masked as Envoy's masked_remote_address
// action does ("a.b.c.0/24", "2001:db8:0:5::/64"): v4_prefix_mask_len
// defaults to 32 and v6_prefix_mask_len to 128. IPv4-mapped IPv6 addresses
// are treated as IPv4.
func MaskedRemoteAddress(addr netip.Addr, a *routev3.RateLimit_Action_MaskedRemoteAddress) (string, bool) {
	if !addr.IsValid() {
		return "", false
	}
	addr = addr.Unmap()
	bits := 128
	if addr.Is4() {
		bits = 32
		if a.GetV4PrefixMaskLen() != nil {
			bits = int(a.GetV4PrefixMaskLen().GetValue())
		}
	} else if a.GetV6PrefixMaskLen() != nil {
		bits = int(a.GetV6PrefixMaskLen().GetValue())
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return "", false
	}
	return p.String(), true
}
