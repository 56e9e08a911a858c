package replay

import (
	"errors"
	"fmt"
	"maps"
	"strings"

	mutationv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// headerMutationFilter is the request side of one Envoy header_mutation HTTP
// filter (envoy.extensions.filters.http.header_mutation.v3.HeaderMutation,
// mutations.request_mutations), in configuration order.
//
// Only the filters after the rate-limit filter are applied (Request is what
// the rate-limit filter sees). Envoy evaluates apply_on_stream_done
// rate_limits at stream end on the live headers, and such a filter runs
// only for admitted requests, so a header it adds (x-ratelimitd-lease in
// docs/algorithms/concurrency.md) tells the replay when Envoy would send a
// lease release.
type headerMutationFilter struct {
	name string
	ops  []*mutationv3.HeaderMutation
}

// compileHeaderMutation returns the request mutations of hf when it is a
// header_mutation filter (ok false otherwise). Errors: what this package
// cannot reproduce from a log: query_parameter_mutations, formatter values
// (%...%), custom formatters, pseudo-headers, a filter disabled by default.
func (e *Envoy) compileHeaderMutation(hf *hcmv3.HttpFilter) (headerMutationFilter, bool, error) {
	var hm hmv3.HeaderMutation
	a := hf.GetTypedConfig()
	if a == nil || !a.MessageIs(&hm) {
		return headerMutationFilter{}, false, nil
	}
	if err := a.UnmarshalTo(&hm); err != nil {
		return headerMutationFilter{}, true, fmt.Errorf("header_mutation filter %s: %w", hf.GetName(), err)
	}
	where := "header_mutation filter " + hf.GetName()
	if hf.GetDisabled() {
		return headerMutationFilter{}, true, fmt.Errorf("%s: a filter disabled by default (enabled per route) is not supported", where)
	}
	m := hm.GetMutations()
	if len(m.GetQueryParameterMutations()) > 0 {
		return headerMutationFilter{}, true, fmt.Errorf("%s: query_parameter_mutations are not supported", where)
	}
	if len(m.GetFormatters()) > 0 {
		return headerMutationFilter{}, true, fmt.Errorf("%s: formatters are not supported", where)
	}
	f := headerMutationFilter{name: hf.GetName(), ops: m.GetRequestMutations()}
	var errs []error
	for i, op := range f.ops {
		if err := e.compileMutation(op); err != nil {
			errs = append(errs, fmt.Errorf("%s request_mutations[%d]: %w", where, i, err))
		}
	}
	return f, true, errors.Join(errs...)
}

func (e *Envoy) compileMutation(op *mutationv3.HeaderMutation) error {
	pseudo := func(k string) error {
		if strings.HasPrefix(k, ":") || strings.EqualFold(k, "host") {
			return fmt.Errorf("header %q: pseudo-headers and host are not supported", k)
		}
		return nil
	}
	switch a := op.GetAction().(type) {
	case *mutationv3.HeaderMutation_Remove:
		return pseudo(a.Remove)
	case *mutationv3.HeaderMutation_Append:
		h := a.Append.GetHeader()
		if err := pseudo(h.GetKey()); err != nil {
			return err
		}
		if strings.Contains(h.GetValue(), "%") || strings.Contains(string(h.GetRawValue()), "%") {
			return fmt.Errorf("header %q: formatter values (%%...%%) are not supported", h.GetKey())
		}
		return nil
	case *mutationv3.HeaderMutation_RemoveOnMatch_:
		return e.compileString(a.RemoveOnMatch.GetKeyMatcher())
	default:
		return fmt.Errorf("mutation %T is not supported", a)
	}
}

// checkNoPerRouteHeaderMutation rejects HeaderMutationPerRoute configs
// (typed_per_filter_config of a route, virtual host or route configuration):
// they add mutations this package does not apply.
func checkNoPerRouteHeaderMutation(rc *routev3.RouteConfiguration) error {
	var per hmv3.HeaderMutationPerRoute
	check := func(where string, m map[string]*anypb.Any) error {
		for k, a := range m {
			if a.MessageIs(&per) {
				return fmt.Errorf("%s typed_per_filter_config %s: per-route header_mutation is not supported", where, k)
			}
		}
		return nil
	}
	if err := check("route configuration", rc.GetTypedPerFilterConfig()); err != nil {
		return err
	}
	for _, vh := range rc.GetVirtualHosts() {
		if err := check("virtual host "+vh.GetName(), vh.GetTypedPerFilterConfig()); err != nil {
			return err
		}
		for i, r := range vh.GetRoutes() {
			if err := check(fmt.Sprintf("virtual host %s route %d", vh.GetName(), i), r.GetTypedPerFilterConfig()); err != nil {
				return err
			}
		}
	}
	return nil
}

// mutate returns a copy of r as the header_mutation filters fs leave it, in
// order (r is not modified). Header names are lower-cased. A header that
// already exists and is appended to (APPEND_IF_EXISTS_OR_ADD, the default)
// becomes "old,new": Request holds one value per name, the form Envoy's
// header matchers see.
func (e *Envoy) mutate(fs []headerMutationFilter, r *Request) *Request {
	if len(fs) == 0 {
		return r
	}
	out := *r
	out.Headers = maps.Clone(r.Headers)
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	h := out.Headers
	for _, f := range fs {
		for _, op := range f.ops {
			switch a := op.GetAction().(type) {
			case *mutationv3.HeaderMutation_Remove:
				delete(h, strings.ToLower(a.Remove))
			case *mutationv3.HeaderMutation_RemoveOnMatch_:
				for k := range h {
					if e.stringMatches(a.RemoveOnMatch.GetKeyMatcher(), k) {
						delete(h, k)
					}
				}
			case *mutationv3.HeaderMutation_Append:
				applyAppend(h, a.Append)
			}
		}
	}
	return &out
}

// applyAppend applies one HeaderValueOption (config.core.v3): append_action,
// or the deprecated append (true: append, false: overwrite), and
// keep_empty_value (an empty value is dropped unless set).
func applyAppend(h map[string]string, o *corev3.HeaderValueOption) {
	k := strings.ToLower(o.GetHeader().GetKey())
	v := o.GetHeader().GetValue()
	if raw := o.GetHeader().GetRawValue(); len(raw) > 0 {
		v = string(raw)
	}
	if v == "" && !o.GetKeepEmptyValue() {
		return
	}
	action := o.GetAppendAction()
	if o.GetAppend() != nil { //nolint:staticcheck // deprecated, still honoured by Envoy
		action = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		if o.GetAppend().GetValue() { //nolint:staticcheck // deprecated, still honoured by Envoy
			action = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
		}
	}
	old, exists := h[k]
	switch action {
	case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
		if exists {
			v = old + "," + v
		}
		h[k] = v
	case corev3.HeaderValueOption_ADD_IF_ABSENT:
		if !exists {
			h[k] = v
		}
	case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
		h[k] = v
	case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
		if exists {
			h[k] = v
		}
	}
}
