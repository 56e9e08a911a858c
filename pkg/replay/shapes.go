package replay

import (
	"fmt"
	"net/netip"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Shape is one way a route rate_limit can produce a descriptor: which of its
// actions yield an entry. Variants holds concrete descriptors of that shape
// (free values, such as header values, taken from the sample function).
type Shape struct {
	// ID is "vhost/route/rate_limits[i]/<present action indexes>".
	ID string
	// Domain is the domain the descriptors are sent under (the filter's,
	// or the route's RateLimitPerRoute.domain).
	Domain string
	// OnStreamDone is the rate_limit's apply_on_stream_done: the
	// descriptor is sent when the stream completes, not enforced.
	OnStreamDone bool
	// Variants are concrete entry lists of this shape, one descriptor
	// each; never empty.
	Variants [][]policy.Entry
}

// SampleAddrs are the client addresses Shapes uses for remote_address and
// masked_remote_address (documentation ranges, RFC 5737 and RFC 3849).
var SampleAddrs = []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8:1:2::10")}

// Shapes enumerates every descriptor shape the routes of e can send (route
// rate_limits, plus the virtual host's when they apply, with the filter's
// stage). sample gives candidate values for an entry whose value comes from
// the request (request_headers, query_parameters: called with the
// descriptor_key); remote addresses come from SampleAddrs. Use it to check
// that a ratelimitd config answers everything an Envoy config sends.
func (e *Envoy) Shapes(sample func(descriptorKey string) []string) []Shape {
	var out []Shape
	for _, vh := range e.routes.GetVirtualHosts() {
		for ri, rt := range vh.GetRoutes() {
			cluster := rt.GetRoute().GetCluster()
			limits, domain := e.routeLimits(vh, rt)
			for li, rl := range limits {
				if rl.GetStage().GetValue() != e.Stage {
					continue
				}
				prefix := fmt.Sprintf("%s/%d/rate_limits[%d]", vh.GetName(), ri, li)
				for _, s := range e.shapesOf(rl, cluster, sample) {
					s.ID = prefix + "/" + s.ID
					s.Domain = domain
					s.OnStreamDone = rl.GetApplyOnStreamDone()
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// option is one possible outcome of an action: an entry (present) or none.
type option struct {
	present bool
	entries []policy.Entry // candidates when present
	drop    bool           // when absent: the whole descriptor is dropped
}

// shapesOf enumerates the descriptor shapes of one route rate_limit: every
// combination of the outcomes of its actions (see actionOptions) that
// yields at least one entry, with its variants.
func (e *Envoy) shapesOf(rl *routev3.RateLimit, cluster string, sample func(string) []string) []Shape {
	var acts [][]option
	for _, a := range rl.GetActions() {
		acts = append(acts, e.actionOptions(a, cluster, sample))
	}
	return combine(acts)
}

// option1 is the present outcome of an action with key k and the
// candidate values vs.
func option1(k string, vs ...string) option {
	o := option{present: true}
	for _, v := range vs {
		o.entries = append(o.entries, policy.Entry{Key: k, Value: v})
	}
	return o
}

// actionOptions lists the possible outcomes of action a on a route to
// cluster, as descriptor evaluates it: the entry it yields (with sample
// values where the value comes from the request) and, when it can yield
// nothing, whether that skips the entry or drops the descriptor.
func (e *Envoy) actionOptions(a *routev3.RateLimit_Action, cluster string, sample func(string) []string) []option {
	switch s := a.GetActionSpecifier().(type) {
	case *routev3.RateLimit_Action_SourceCluster_:
		return []option{option1("source_cluster", e.ServiceCluster)}
	case *routev3.RateLimit_Action_DestinationCluster_:
		if cluster == "" {
			return []option{{drop: true}}
		}
		return []option{option1("destination_cluster", cluster)}
	case *routev3.RateLimit_Action_RequestHeaders_:
		k := s.RequestHeaders.GetDescriptorKey()
		return []option{option1(k, sample(k)...), {drop: !s.RequestHeaders.GetSkipIfAbsent()}}
	case *routev3.RateLimit_Action_QueryParameters_:
		k := s.QueryParameters.GetDescriptorKey()
		return []option{option1(k, sample(k)...), {drop: !s.QueryParameters.GetSkipIfAbsent()}}
	case *routev3.RateLimit_Action_RemoteAddress_:
		var vs []string
		for _, a := range SampleAddrs {
			vs = append(vs, a.String())
		}
		return []option{option1("remote_address", vs...)}
	case *routev3.RateLimit_Action_MaskedRemoteAddress_:
		var vs []string
		for _, a := range SampleAddrs {
			v, _ := MaskedRemoteAddress(a, s.MaskedRemoteAddress)
			vs = append(vs, v)
		}
		return []option{option1("masked_remote_address", vs...)}
	case *routev3.RateLimit_Action_GenericKey_:
		k := s.GenericKey.GetDescriptorKey()
		if k == "" {
			k = "generic_key"
		}
		return []option{option1(k, s.GenericKey.GetDescriptorValue())}
	case *routev3.RateLimit_Action_HeaderValueMatch_:
		hv := s.HeaderValueMatch
		k := hv.GetDescriptorKey()
		if k == "" {
			k = "header_match"
		}
		if hv.GetDefaultValue() != "" {
			return []option{option1(k, hv.GetDescriptorValue()), option1(k, hv.GetDefaultValue())}
		}
		return []option{option1(k, hv.GetDescriptorValue()), {drop: true}}
	case *routev3.RateLimit_Action_QueryParameterValueMatch_:
		qv := s.QueryParameterValueMatch
		k := qv.GetDescriptorKey()
		if k == "" {
			k = "query_match"
		}
		return []option{option1(k, qv.GetDescriptorValue()), {drop: true}}
	}
	return []option{{drop: true}}
}

// combine walks every choice of one option per action (acts[i] are the
// options of action i) that drops nothing, and returns a Shape for each
// that yields at least one entry: ID the indexes of the present actions,
// Variants the cross product of their candidate entries.
func combine(acts [][]option) []Shape {
	var out []Shape
	var rec func(i int, id []string, chosen []option)
	rec = func(i int, id []string, chosen []option) {
		if i == len(acts) {
			var variants [][]policy.Entry
			variants = append(variants, nil)
			for _, o := range chosen {
				if !o.present {
					continue
				}
				var next [][]policy.Entry
				for _, v := range variants {
					for _, en := range o.entries {
						next = append(next, append(append([]policy.Entry(nil), v...), en))
					}
				}
				variants = next
			}
			if len(variants) > 0 && len(variants[0]) > 0 {
				out = append(out, Shape{ID: strings.Join(id, ","), Variants: variants})
			}
			return
		}
		for _, o := range acts[i] {
			if o.drop {
				continue
			}
			if o.present && len(o.entries) == 0 {
				continue // no sample value: cannot build it
			}
			nid := id
			if o.present {
				nid = append(append([]string(nil), id...), fmt.Sprint(i))
			}
			rec(i+1, nid, append(append([]option(nil), chosen...), o))
		}
	}
	rec(0, nil, nil)
	return out
}
