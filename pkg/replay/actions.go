package replay

import (
	"net/netip"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Descriptor is one rate-limit descriptor Envoy would send.
type Descriptor struct {
	// Entries are the descriptor entries in action order
	// (RateLimitDescriptor.entries); never empty.
	Entries []policy.Entry
	// HitsAddend is the route rate_limit's hits_addend.number (0 = unset:
	// the service uses 1).
	HitsAddend uint64
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
			k, v, ok := e.headerValueMatch(s.HeaderValueMatch, r)
			if !ok {
				return Descriptor{}, false
			}
			add(k, v)
		case *routev3.RateLimit_Action_QueryParameterValueMatch_:
			k, v, ok := e.queryParameterValueMatch(s.QueryParameterValueMatch, r)
			if !ok {
				return Descriptor{}, false
			}
			add(k, v)
		default:
			return Descriptor{}, false
		}
	}
	if len(d.Entries) == 0 {
		return Descriptor{}, false
	}
	return d, true
}

// headerValueMatch evaluates a header_value_match action on r: the entry
// (descriptor_key, default "header_match"; descriptor_value) when every
// header matcher matches and expect_match is true (the default), or when
// not all match and it is false; else default_value when set. ok is false
// when the action yields no entry.
func (e *Envoy) headerValueMatch(hv *routev3.RateLimit_Action_HeaderValueMatch, r *Request) (k, v string, ok bool) {
	all := true
	for _, h := range hv.GetHeaders() {
		if !e.headerMatches(h, r) {
			all = false
			break
		}
	}
	expect := hv.GetExpectMatch() == nil || hv.GetExpectMatch().GetValue()
	k = hv.GetDescriptorKey()
	if k == "" {
		k = "header_match"
	}
	switch {
	case all == expect:
		return k, hv.GetDescriptorValue(), true
	case hv.GetDefaultValue() != "":
		return k, hv.GetDefaultValue(), true
	}
	return "", "", false
}

// queryParameterValueMatch evaluates a query_parameter_value_match action
// on r: the entry (descriptor_key, default "query_match";
// descriptor_value) when the query parameter matchers all match and
// expect_match is true (the default), or not all match and it is false.
// ok is false otherwise.
func (e *Envoy) queryParameterValueMatch(qv *routev3.RateLimit_Action_QueryParameterValueMatch, r *Request) (k, v string, ok bool) {
	q := r.query()
	all := true
	for _, qp := range qv.GetQueryParameters() {
		vs, present := q[qp.GetName()]
		if qp.GetPresentMatch() {
			all = all && present
		} else if qp.GetStringMatch() != nil {
			all = all && present && e.stringMatches(qp.GetStringMatch(), vs[0])
		}
	}
	expect := qv.GetExpectMatch() == nil || qv.GetExpectMatch().GetValue()
	k = qv.GetDescriptorKey()
	if k == "" {
		k = "query_match"
	}
	if all != expect {
		return "", "", false
	}
	return k, qv.GetDescriptorValue(), true
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
