package service

import (
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The codec's own decoding of a RateLimitRequest (decodeRequest) and
// encoding of a RateLimitResponse (responseSize, appendResponse), written with protowire
// for the messages' usual shapes: fewer allocations and no reflection.
// Each handles only wire data or messages it can treat exactly as
// protobuf-go does and reports false for anything else (unknown fields,
// known fields with another wire type, a singular message field sent
// twice, invalid UTF-8, malformed wire data; on the encoding side any
// field the service does not set), which the codec then hands to
// protobuf-go unchanged. FuzzServerCodec, TestDecodeRequestAgrees and
// TestEncodeResponseSameBytes hold them to protobuf-go's results.

// Field numbers of the RLS messages (envoy/service/ratelimit/v3/rls.proto,
// envoy/extensions/common/ratelimit/v3/ratelimit.proto).
const (
	reqDomain      = 1
	reqDescriptors = 2
	reqHitsAddend  = 3

	descEntries        = 1
	descLimit          = 2
	descHitsAddend     = 3
	descIsNegativeHits = 4

	entryKey   = 1
	entryValue = 2

	wireOverrideRPU  = 1
	wireOverrideUnit = 2

	wrapperValue = 1
)

// requestShape is what the first pass over a request learns: how many
// descriptors, entries, overrides and hits_addend wrappers to allocate,
// and the bytes of the entries' strings.
type requestShape struct {
	descs, entries, limits, hits int
	strBytes                     int
}

// smallRequest holds, in one allocation, the messages of a request of at
// most one descriptor with at most two entries (one Envoy action, or a
// nested pair), the most common shape.
type smallRequest struct {
	desc    [1]rlcommon.RateLimitDescriptor
	descp   [1]*rlcommon.RateLimitDescriptor
	entries [2]rlcommon.RateLimitDescriptor_Entry
	entryp  [2]*rlcommon.RateLimitDescriptor_Entry
}

// decodeRequest decodes b into req, a zero RateLimitRequest, exactly as
// proto.Unmarshal would, and reports true; it reports false, with req
// untouched, for wire data outside the shapes it decodes (see above),
// including every input proto.Unmarshal rejects.
//
// Memory: the domain and the entries' strings are two copies (so a string
// kept by the service, such as a domain in a metric label, keeps no more
// than it needs); the descriptors, their entries and the slices of
// pointers to them are one allocation for a request of one descriptor of
// at most two entries, else four; an override or a hits_addend wrapper is
// one each.
func decodeRequest(b []byte, req *rlsv3.RateLimitRequest) bool {
	var sh requestShape
	if !scanRequest(b, &sh) {
		return false
	}
	var (
		descs   []rlcommon.RateLimitDescriptor
		descp   []*rlcommon.RateLimitDescriptor
		entries []rlcommon.RateLimitDescriptor_Entry
		entryp  []*rlcommon.RateLimitDescriptor_Entry
	)
	switch {
	case sh.descs == 0:
	case sh.descs == 1 && sh.entries <= 2:
		blk := new(smallRequest)
		descs, descp = blk.desc[:], blk.descp[:]
		entries, entryp = blk.entries[:sh.entries], blk.entryp[:]
	default:
		descs, descp = make([]rlcommon.RateLimitDescriptor, sh.descs), make([]*rlcommon.RateLimitDescriptor, sh.descs)
		entries, entryp = make([]rlcommon.RateLimitDescriptor_Entry, sh.entries), make([]*rlcommon.RateLimitDescriptor_Entry, sh.entries)
	}
	var strs strings.Builder
	strs.Grow(sh.strBytes)
	nd, ne := 0, 0
	for i := 0; i < len(b); {
		num, _, n := protowire.ConsumeTag(b[i:])
		i += n
		switch num {
		case reqDomain:
			v, n := protowire.ConsumeBytes(b[i:])
			i += n
			req.Domain = string(v)
		case reqHitsAddend:
			v, n := protowire.ConsumeVarint(b[i:])
			i += n
			req.HitsAddend = uint32(v)
		case reqDescriptors:
			v, n := protowire.ConsumeBytes(b[i:])
			i += n
			d := &descs[nd]
			descp[nd] = d
			nd++
			first := ne
			ne = fillDescriptor(v, d, entries, entryp, ne, &strs)
			if ne > first {
				d.Entries = entryp[first:ne:ne]
			}
		}
	}
	if nd > 0 {
		req.Descriptors = descp[:nd:nd]
	}
	return true
}

// fillDescriptor decodes the descriptor v (already checked by
// scanDescriptor) into d, its entries into entries[ne:] (pointed to by
// entryp[ne:]) with their strings written to strs, and returns the new ne.
func fillDescriptor(v []byte, d *rlcommon.RateLimitDescriptor, entries []rlcommon.RateLimitDescriptor_Entry, entryp []*rlcommon.RateLimitDescriptor_Entry, ne int, strs *strings.Builder) int {
	for i := 0; i < len(v); {
		num, _, n := protowire.ConsumeTag(v[i:])
		i += n
		switch num {
		case descEntries:
			ev, n := protowire.ConsumeBytes(v[i:])
			i += n
			e := &entries[ne]
			entryp[ne] = e
			ne++
			for j := 0; j < len(ev); {
				num, _, n := protowire.ConsumeTag(ev[j:])
				j += n
				s, n := protowire.ConsumeBytes(ev[j:])
				j += n
				str := appendString(strs, s)
				if num == entryKey {
					e.Key = str
				} else {
					e.Value = str
				}
			}
		case descLimit:
			lv, n := protowire.ConsumeBytes(v[i:])
			i += n
			o := new(rlcommon.RateLimitDescriptor_RateLimitOverride)
			for j := 0; j < len(lv); {
				num, _, n := protowire.ConsumeTag(lv[j:])
				j += n
				x, n := protowire.ConsumeVarint(lv[j:])
				j += n
				if num == wireOverrideRPU {
					o.RequestsPerUnit = uint32(x)
				} else {
					o.Unit = typev3.RateLimitUnit(int32(x))
				}
			}
			d.Limit = o
		case descHitsAddend:
			hv, n := protowire.ConsumeBytes(v[i:])
			i += n
			w := new(wrapperspb.UInt64Value)
			for j := 0; j < len(hv); {
				_, _, n := protowire.ConsumeTag(hv[j:])
				j += n
				x, n := protowire.ConsumeVarint(hv[j:])
				j += n
				w.Value = x
			}
			d.HitsAddend = w
		case descIsNegativeHits:
			x, n := protowire.ConsumeVarint(v[i:])
			i += n
			d.IsNegativeHits = x != 0
		}
	}
	return ne
}

// appendString writes s to strs, grown beforehand to hold every string of
// the request so that it never reallocates, and returns the written bytes
// as a string sharing strs' buffer (whose written bytes never change).
func appendString(strs *strings.Builder, s []byte) string {
	if len(s) == 0 {
		return ""
	}
	start := strs.Len()
	strs.Write(s)
	return strs.String()[start:]
}

// scanRequest checks that b is a RateLimitRequest decodeRequest decodes
// exactly (see decodeRequest) and counts into sh what it allocates.
func scanRequest(b []byte, sh *requestShape) bool {
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return false
		}
		i += n
		switch {
		case num == reqDomain && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b[i:])
			if n < 0 || !utf8.Valid(v) {
				return false
			}
			i += n
		case num == reqHitsAddend && typ == protowire.VarintType:
			_, n := protowire.ConsumeVarint(b[i:])
			if n < 0 {
				return false
			}
			i += n
		case num == reqDescriptors && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b[i:])
			if n < 0 || !scanDescriptor(v, sh) {
				return false
			}
			i += n
			sh.descs++
		default:
			return false
		}
	}
	return true
}

// scanDescriptor checks one RateLimitDescriptor for scanRequest.
func scanDescriptor(v []byte, sh *requestShape) bool {
	var limit, hits bool
	for i := 0; i < len(v); {
		num, typ, n := protowire.ConsumeTag(v[i:])
		if n < 0 {
			return false
		}
		i += n
		switch {
		case num == descEntries && typ == protowire.BytesType:
			ev, n := protowire.ConsumeBytes(v[i:])
			if n < 0 || !scanEntry(ev, sh) {
				return false
			}
			i += n
			sh.entries++
		case num == descLimit && typ == protowire.BytesType && !limit:
			// A second occurrence would be merged into the first: left
			// to protobuf-go.
			lv, n := protowire.ConsumeBytes(v[i:])
			if n < 0 || !scanVarints(lv, wireOverrideRPU, wireOverrideUnit) {
				return false
			}
			i += n
			limit = true
			sh.limits++
		case num == descHitsAddend && typ == protowire.BytesType && !hits:
			hv, n := protowire.ConsumeBytes(v[i:])
			if n < 0 || !scanVarints(hv, wrapperValue, wrapperValue) {
				return false
			}
			i += n
			hits = true
			sh.hits++
		case num == descIsNegativeHits && typ == protowire.VarintType:
			_, n := protowire.ConsumeVarint(v[i:])
			if n < 0 {
				return false
			}
			i += n
		default:
			return false
		}
	}
	return true
}

// scanEntry checks one descriptor entry (key and value, valid UTF-8) and
// adds its strings' bytes to sh.
func scanEntry(ev []byte, sh *requestShape) bool {
	for i := 0; i < len(ev); {
		num, typ, n := protowire.ConsumeTag(ev[i:])
		if n < 0 || (num != entryKey && num != entryValue) || typ != protowire.BytesType {
			return false
		}
		i += n
		s, n := protowire.ConsumeBytes(ev[i:])
		if n < 0 || !utf8.Valid(s) {
			return false
		}
		i += n
		sh.strBytes += len(s)
	}
	return true
}

// scanVarints checks that v holds only varint fields numbered a or b.
func scanVarints(v []byte, a, b protowire.Number) bool {
	for i := 0; i < len(v); {
		num, typ, n := protowire.ConsumeTag(v[i:])
		if n < 0 || (num != a && num != b) || typ != protowire.VarintType {
			return false
		}
		i += n
		_, n = protowire.ConsumeVarint(v[i:])
		if n < 0 {
			return false
		}
		i += n
	}
	return true
}

// Field numbers of the response messages.
const (
	respOverallCode     = 1
	respStatuses        = 2
	respResponseHeaders = 3
	respRequestHeaders  = 4
	respRawBody         = 5

	statusCode           = 1
	statusCurrentLimit   = 2
	statusLimitRemaining = 3
	statusDurationReset  = 4

	limitRequestsPerUnit = 1
	limitUnit            = 2
	limitName            = 3

	durationSeconds = 1
	durationNanos   = 2

	headerKey      = 1
	headerValue    = 2
	headerRawValue = 3
)

// responseSize returns the size of the wire form of r and true when
// appendResponse writes r exactly as proto.Marshal does: no field it does
// not write (dynamic_metadata, quota, unit_multiplier), no unknown fields,
// no nil list element, every string valid UTF-8 (proto.Marshal fails
// otherwise). Else it returns false.
func responseSize(r *rlsv3.RateLimitResponse) (int, bool) {
	if r.DynamicMetadata != nil || r.Quota != nil || hasUnknown(r) {
		return 0, false
	}
	n := sizeVarintField(uint64(r.OverallCode))
	for _, st := range r.Statuses {
		if st == nil || st.Quota != nil || hasUnknown(st) {
			return 0, false
		}
		if l := st.CurrentLimit; l != nil && (l.UnitMultiplier != nil || hasUnknown(l) || !utf8.ValidString(l.Name)) {
			return 0, false
		}
		if d := st.DurationUntilReset; d != nil && hasUnknown(d) {
			return 0, false
		}
		n += sizeMessageField(statusSize(st))
	}
	for _, hs := range [2][]*corev3.HeaderValue{r.ResponseHeadersToAdd, r.RequestHeadersToAdd} {
		for _, h := range hs {
			if h == nil || hasUnknown(h) || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
				return 0, false
			}
			n += sizeMessageField(headerSize(h))
		}
	}
	n += sizeBytesField(len(r.RawBody))
	return n, true
}

// appendResponse appends the wire form of r, for which responseSize
// reported true, to b.
func appendResponse(b []byte, r *rlsv3.RateLimitResponse) []byte {
	b = appendVarintField(b, respOverallCode, uint64(r.OverallCode))
	for _, st := range r.Statuses {
		b = protowire.AppendTag(b, respStatuses, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(statusSize(st)))
		b = appendVarintField(b, statusCode, uint64(st.Code))
		if l := st.CurrentLimit; l != nil {
			b = protowire.AppendTag(b, statusCurrentLimit, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(limitSize(l)))
			b = appendVarintField(b, limitRequestsPerUnit, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, limitUnit, uint64(l.Unit))
			b = appendStringField(b, limitName, l.Name)
		}
		b = appendVarintField(b, statusLimitRemaining, uint64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = protowire.AppendTag(b, statusDurationReset, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(durationSize(d)))
			b = appendVarintField(b, durationSeconds, uint64(d.Seconds))
			b = appendVarintField(b, durationNanos, uint64(d.Nanos))
		}
	}
	for i, hs := range [2][]*corev3.HeaderValue{r.ResponseHeadersToAdd, r.RequestHeadersToAdd} {
		num := protowire.Number(respResponseHeaders + i)
		for _, h := range hs {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(headerSize(h)))
			b = appendStringField(b, headerKey, h.Key)
			b = appendStringField(b, headerValue, h.Value)
			if len(h.RawValue) > 0 {
				b = protowire.AppendTag(b, headerRawValue, protowire.BytesType)
				b = protowire.AppendBytes(b, h.RawValue)
			}
		}
	}
	if len(r.RawBody) > 0 {
		b = protowire.AppendTag(b, respRawBody, protowire.BytesType)
		b = protowire.AppendBytes(b, r.RawBody)
	}
	return b
}

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := sizeVarintField(uint64(st.Code)) + sizeVarintField(uint64(st.LimitRemaining))
	if st.CurrentLimit != nil {
		n += sizeMessageField(limitSize(st.CurrentLimit))
	}
	if st.DurationUntilReset != nil {
		n += sizeMessageField(durationSize(st.DurationUntilReset))
	}
	return n
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	return sizeVarintField(uint64(l.RequestsPerUnit)) + sizeVarintField(uint64(l.Unit)) + sizeBytesField(len(l.Name))
}

func durationSize(d *durationpb.Duration) int {
	return sizeVarintField(uint64(d.Seconds)) + sizeVarintField(uint64(d.Nanos))
}

func headerSize(h *corev3.HeaderValue) int {
	return sizeBytesField(len(h.Key)) + sizeBytesField(len(h.Value)) + sizeBytesField(len(h.RawValue))
}

// hasUnknown reports whether m holds unknown fields (which proto.Marshal
// writes after the known ones).
func hasUnknown(m protoreflect.ProtoMessage) bool { return len(m.ProtoReflect().GetUnknown()) > 0 }

// sizeVarintField is the size of a proto3 scalar field of value v: 0 for
// 0, which proto3 does not write. Every field number here has a one-byte
// tag.
func sizeVarintField(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

// sizeBytesField is the size of a proto3 string or bytes field of n bytes
// (0 when empty).
func sizeBytesField(n int) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(n)
}

// sizeMessageField is the size of a present message field whose message
// is n bytes.
func sizeMessageField(n int) int { return 1 + protowire.SizeBytes(n) }

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}
