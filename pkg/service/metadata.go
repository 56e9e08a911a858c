package service

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata builds envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA
// struct (docs/responses.md): domain, descriptors (entries as "key=value",
// limit override as text, hitsAddend), request hitsAddend, and the deep
// merge (first value wins) of the config metadata of every matched
// descriptor that is not OVER_LIMIT. Request strings that are not valid
// UTF-8 (only from in-process callers) appear escaped (InvalidUTF8Prefix +
// hex).
func (s *Service) dynamicMetadata(req *rlsv3.RateLimitRequest, ds []descState) *structpb.Struct {
	descs := make([]any, len(req.GetDescriptors()))
	for i, d := range req.GetDescriptors() {
		es := make([]any, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			es[j] = validUTF8(e.GetKey()) + "=" + validUTF8(e.GetValue()) // structpb strings must be UTF-8
		}
		m := map[string]any{"entries": es}
		if l := d.GetLimit(); l != nil {
			m["limit"] = fmt.Sprintf("requests_per_unit:%d unit:%s", l.GetRequestsPerUnit(), l.GetUnit())
		}
		if h := d.GetHitsAddend(); h != nil {
			m["hitsAddend"] = float64(h.GetValue())
		}
		descs[i] = m
	}
	out := map[string]any{"domain": validUTF8(req.GetDomain()), "descriptors": descs}
	if h := req.GetHitsAddend(); h != 0 {
		out["hitsAddend"] = float64(h)
	}
	merged := map[string]any{}
	for i := range ds {
		st := &ds[i]
		if !st.matched || st.status == nil || st.status.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		mergeFirstWins(merged, st.match.Rule.Metadata)
	}
	if len(merged) > 0 {
		out["metadata"] = merged
	}
	v, err := structpb.NewStruct(out)
	if err != nil {
		s.opts.Logger.Warn("service: dynamic metadata not representable", "error", err)
		delete(out, "metadata")
		v, _ = structpb.NewStruct(out)
	}
	return v
}

// mergeFirstWins merges src into dst without touching src: maps merge
// recursively, and on any other conflict the value already in dst stays.
func mergeFirstWins(dst map[string]any, src map[string]any) {
	for k, v := range src {
		old, ok := dst[k]
		if !ok {
			dst[k] = normalize(v)
			continue
		}
		om, ok1 := old.(map[string]any)
		if nm := asMap(v); ok1 && nm != nil {
			mergeFirstWins(om, nm)
		}
	}
}

func asMap(v any) map[string]any {
	switch m := v.(type) {
	case map[string]any:
		return m
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, x := range m {
			out[fmt.Sprint(k)] = x
		}
		return out
	}
	return nil
}

// normalize deep-copies a YAML value into types structpb accepts.
func normalize(v any) any {
	if m := asMap(v); m != nil {
		out := make(map[string]any, len(m))
		for k, x := range m {
			out[k] = normalize(x)
		}
		return out
	}
	switch x := v.(type) {
	case nil, bool, string, float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return x
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	}
	return fmt.Sprint(v)
}
