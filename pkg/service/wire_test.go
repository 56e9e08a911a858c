package service

import (
	"bytes"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"pgregory.net/rapid"
)

// wireGen draws the wire form of a RateLimitRequest field by field. With
// odd set it also draws what decodeRequest leaves to protobuf-go: unknown
// fields (varint, fixed, bytes, groups), known fields with another wire
// type, invalid UTF-8, a unit_multiplier,
// truncation. Varints are sometimes written non-minimally and scalar values
// range over the whole uint64 (uint32 and enum fields truncate).
type wireGen struct {
	t   *rapid.T
	odd *oddSpot // nil: nothing odd
}

// oddSpot places one odd field: at the at-th place one could go.
type oddSpot struct{ at, seen int }

func (g wireGen) varint(b []byte, label string) []byte {
	v := rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64Range(0, 300), rapid.Uint64()).Draw(g.t, label)
	if rapid.IntRange(0, 5).Draw(g.t, label+"-padded") == 0 && v < 1<<56 {
		// non-minimal: the last group continued by a zero byte
		for v >= 0x80 {
			b = append(b, byte(v)|0x80)
			v >>= 7
		}
		return append(b, byte(v)|0x80, 0x00)
	}
	return protowire.AppendVarint(b, v)
}

func (g wireGen) str(label string) []byte {
	choices := []*rapid.Generator[string]{
		rapid.StringMatching(`[a-z0-9_.-]{0,12}`),
		rapid.SampledFrom([]string{"", "user", "\u00ff", "日本", "\uFFFD"}),
	}
	if g.oddOne() {
		choices = []*rapid.Generator[string]{rapid.SampledFrom([]string{"\xff", "a\x80", "\xed\xa0\x80"})}
	}
	return []byte(rapid.OneOf(choices...).Draw(g.t, label))
}

func (g wireGen) bytesField(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func (g wireGen) varintField(b []byte, num protowire.Number, label string) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return g.varint(b, label)
}

// unknown appends a field its message does not have, or a field it has with
// another wire type; known lists the message's fields and their types.
func (g wireGen) unknown(b []byte, known map[protowire.Number]protowire.Type) []byte {
	// mostly the numbers of known fields, with another wire type
	num := protowire.Number(rapid.OneOf(rapid.IntRange(1, 5), rapid.IntRange(1, 1<<29-1)).Draw(g.t, "unknown-num"))
	kinds := []protowire.Type{protowire.VarintType, protowire.Fixed32Type, protowire.Fixed64Type, protowire.StartGroupType, protowire.BytesType}
	typ := rapid.SampledFrom(kinds).Draw(g.t, "unknown-type")
	if t, ok := known[num]; ok && t == typ {
		typ = protowire.Fixed32Type
	}
	switch typ {
	case protowire.VarintType:
		return g.varintField(b, num, "unknown-varint")
	case protowire.Fixed32Type:
		b = protowire.AppendTag(b, num, protowire.Fixed32Type)
		return protowire.AppendFixed32(b, rapid.Uint32().Draw(g.t, "f32"))
	case protowire.Fixed64Type:
		b = protowire.AppendTag(b, num, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, rapid.Uint64().Draw(g.t, "f64"))
	case protowire.StartGroupType:
		b = protowire.AppendTag(b, num, protowire.StartGroupType)
		b = g.varintField(b, 1, "group-varint")
		return protowire.AppendTag(b, num, protowire.EndGroupType)
	default:
		return g.bytesField(b, num, g.str("unknown-bytes"))
	}
}

var (
	requestFields    = map[protowire.Number]protowire.Type{reqDomain: protowire.BytesType, reqDescriptors: protowire.BytesType, reqHitsAddend: protowire.VarintType}
	descriptorFields = map[protowire.Number]protowire.Type{descEntries: protowire.BytesType, descLimit: protowire.BytesType, descHitsAddend: protowire.BytesType, descIsNegativeHits: protowire.VarintType}
	entryFields      = map[protowire.Number]protowire.Type{entryKey: protowire.BytesType, entryValue: protowire.BytesType}
)

func (g wireGen) oddOne() bool {
	if g.odd == nil {
		return false
	}
	g.odd.seen++
	return g.odd.seen == g.odd.at
}

func (g wireGen) entry() []byte {
	var b []byte
	for range rapid.IntRange(0, 3).Draw(g.t, "entry-fields") {
		switch {
		case g.oddOne():
			b = g.unknown(b, entryFields)
		case rapid.Bool().Draw(g.t, "key"):
			b = g.bytesField(b, entryKey, g.str("k"))
		default:
			b = g.bytesField(b, entryValue, g.str("v"))
		}
	}
	return b
}

func (g wireGen) descriptor() []byte {
	var b []byte
	for range rapid.IntRange(0, 5).Draw(g.t, "desc-fields") {
		if g.oddOne() {
			b = g.unknown(b, descriptorFields)
			continue
		}
		switch rapid.IntRange(0, 4).Draw(g.t, "desc-field") {
		case 0, 1:
			b = g.bytesField(b, descEntries, g.entry())
		case 2:
			var o []byte
			for range rapid.IntRange(0, 3).Draw(g.t, "override-fields") {
				o = g.varintField(o, protowire.Number(rapid.IntRange(1, 2).Draw(g.t, "override-field")), "override")
			}
			if g.oddOne() {
				o = g.bytesField(o, 3, []byte{0x08, 0x02}) // unit_multiplier
			}
			b = g.bytesField(b, descLimit, o)
		case 3:
			var w []byte
			for range rapid.IntRange(0, 2).Draw(g.t, "wrapper-fields") {
				w = g.varintField(w, wrapperValue, "hits")
			}
			b = g.bytesField(b, descHitsAddend, w)
		default:
			b = g.varintField(b, descIsNegativeHits, "negative")
		}
	}
	return b
}

func (g wireGen) request() []byte {
	var b []byte
	last := 0 // where the last field starts
	for range rapid.IntRange(0, 8).Draw(g.t, "req-fields") {
		last = len(b)
		if g.oddOne() {
			b = g.unknown(b, requestFields)
			continue
		}
		switch rapid.IntRange(0, 3).Draw(g.t, "req-field") {
		case 0:
			b = g.bytesField(b, reqDomain, g.str("domain"))
		case 1:
			b = g.varintField(b, reqHitsAddend, "req-hits")
		default:
			b = g.bytesField(b, reqDescriptors, g.descriptor())
		}
	}
	if len(b) > 0 && g.oddOne() {
		// cut inside the last field: malformed
		b = b[:len(b)-rapid.IntRange(1, len(b)-last-1).Draw(g.t, "cut")]
	}
	return b
}

// decodeBoth decodes b with decodeRequest and proto.Unmarshal, fails t
// when they disagree, and reports whether decodeRequest took b.
func decodeBoth(t interface{ Fatalf(string, ...any) }, b []byte) (fast bool) {
	got := &rlsv3.RateLimitRequest{}
	fast = decodeRequest(b, got)
	std := &rlsv3.RateLimitRequest{}
	stdErr := proto.Unmarshal(b, std)
	if !fast {
		if !proto.Equal(got, &rlsv3.RateLimitRequest{}) {
			t.Fatalf("decodeRequest declined %x but changed the message: %v", b, got)
		}
		return false
	}
	if stdErr != nil {
		t.Fatalf("decodeRequest accepted %x, proto.Unmarshal rejects it: %v", b, stdErr)
	}
	if !proto.Equal(got, std) {
		t.Fatalf("%x: decodeRequest %v, proto.Unmarshal %v", b, got, std)
	}
	return true
}

// decodeRequest decodes exactly as proto.Unmarshal: for every wire form it
// accepts the message equals protobuf-go's (unknown fields included, so a
// request with any is declined, never decoded without them), and what it
// declines it leaves untouched for the codec's fallback.
func TestDecodeRequestAgrees(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		g := wireGen{t: rt, odd: &oddSpot{at: rapid.IntRange(1, 16).Draw(rt, "odd-at")}}
		b := g.request()
		if decodeBoth(rt, b) && g.odd.seen >= g.odd.at {
			rt.Fatalf("decodeRequest took %x, which has an odd field", b)
		}
	})
}

// Every request of the usual shapes (any number of descriptors and
// entries, overrides, hits_addend wrappers present with 0 or absent,
// is_negative_hits, empty descriptors and entries, non-minimal varints)
// takes decodeRequest's path: the property above is not vacuous, and
// the codec's savings apply to what Envoy sends.
func TestDecodeRequestTakesUsualShapes(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		b := wireGen{t: rt}.request()
		if !fastRequest(b) {
			return
		}
		if !decodeBoth(rt, b) {
			rt.Fatalf("decodeRequest declined the usual request %x", b)
		}
	})
}

// fastRequest reports whether b sends no descriptor field limit or
// hits_addend twice (the one usual-generator output decodeRequest declines:
// protobuf-go merges the two).
func fastRequest(b []byte) bool {
	ok := true
	walk(b, func(num protowire.Number, v []byte) {
		if num != reqDescriptors {
			return
		}
		var limit, hits int
		walk(v, func(num protowire.Number, _ []byte) {
			switch num {
			case descLimit:
				limit++
			case descHitsAddend:
				hits++
			}
		})
		ok = ok && limit <= 1 && hits <= 1
	})
	return ok
}

func walk(b []byte, f func(protowire.Number, []byte)) {
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		i += n
		m := protowire.ConsumeFieldValue(num, typ, b[i:])
		v := b[i : i+m]
		if typ == protowire.BytesType {
			v, _ = protowire.ConsumeBytes(v)
		}
		f(num, v)
		i += m
	}
}

// Huge requests (many descriptors and entries, long values) decode exactly
// as protobuf-go decodes them.
func TestDecodeRequestHuge(t *testing.T) {
	var b []byte
	b = protowire.AppendTag(b, reqDomain, protowire.BytesType)
	b = protowire.AppendString(b, strings.Repeat("d", 1<<16))
	for i := range 2000 {
		var d []byte
		for j := range i%5 + 1 {
			var e []byte
			e = protowire.AppendTag(e, entryKey, protowire.BytesType)
			e = protowire.AppendString(e, strings.Repeat("k", j))
			e = protowire.AppendTag(e, entryValue, protowire.BytesType)
			e = protowire.AppendString(e, strings.Repeat("v", (i*31+j)%700))
			d = protowire.AppendTag(d, descEntries, protowire.BytesType)
			d = protowire.AppendBytes(d, e)
		}
		b = protowire.AppendTag(b, reqDescriptors, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	got, std := &rlsv3.RateLimitRequest{}, &rlsv3.RateLimitRequest{}
	if !decodeRequest(b, got) {
		t.Fatal("declined")
	}
	if err := proto.Unmarshal(b, std); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, std) {
		t.Fatal("decodeRequest and proto.Unmarshal differ")
	}
}

// A descriptor's limit or hits_addend sent twice is merged field by field
// (protobuf-go's rule for a singular message), not replaced.
func TestDecodeRequestMergesSingularMessages(t *testing.T) {
	msg := func(num protowire.Number, fields ...uint64) []byte {
		var m []byte
		for i := 0; i < len(fields); i += 2 {
			m = protowire.AppendTag(m, protowire.Number(fields[i]), protowire.VarintType)
			m = protowire.AppendVarint(m, fields[i+1])
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), m)
	}
	for _, d := range [][]byte{
		append(msg(descLimit, wireOverrideRPU, 5), msg(descLimit, wireOverrideUnit, 2)...),
		append(msg(descHitsAddend, wrapperValue, 7), msg(descHitsAddend)...),
	} {
		b := protowire.AppendBytes(protowire.AppendTag(nil, reqDescriptors, protowire.BytesType), d)
		decodeBoth(t, b)
	}
}

// responseGen draws a RateLimitResponse; with odd set also what
// appendResponse leaves to protobuf-go (dynamic metadata, quotas, a unit
// multiplier, unknown fields, nil list elements, invalid UTF-8).
func responseGen(t *rapid.T, odd bool) (*rlsv3.RateLimitResponse, bool) {
	oddOne := func(label string) bool { return odd && rapid.IntRange(0, 5).Draw(t, label) == 0 }
	took := false
	str := func(label string) string {
		if oddOne(label + "-odd") {
			took = true
			return "bad\xff"
		}
		return rapid.OneOf(rapid.StringMatching(`[ -~]{0,20}`), rapid.SampledFrom([]string{"", "日本", "\uFFFD"})).Draw(t, label)
	}
	num := func(label string) uint64 {
		return rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64Range(0, 300), rapid.Uint64()).Draw(t, label)
	}
	r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(int32(num("overall")))}
	for range rapid.IntRange(0, 4).Draw(t, "statuses") {
		if oddOne("nil-status") {
			took = true
			r.Statuses = append(r.Statuses, nil)
			continue
		}
		st := &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:           rlsv3.RateLimitResponse_Code(int32(num("code"))),
			LimitRemaining: uint32(num("remaining")),
		}
		if rapid.Bool().Draw(t, "limit") {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: str("name"), RequestsPerUnit: uint32(num("rpu")), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(int32(num("unit")))}
			if oddOne("multiplier") {
				took = true
				st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(2)
			}
		}
		if rapid.Bool().Draw(t, "duration") {
			st.DurationUntilReset = &durationpb.Duration{Seconds: int64(num("seconds")), Nanos: int32(num("nanos"))}
		}
		if oddOne("status-quota") {
			took = true
			st.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 3}
		}
		if oddOne("status-unknown") {
			took = true
			st.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
		}
		r.Statuses = append(r.Statuses, st)
	}
	for i := range 2 {
		for range rapid.IntRange(0, 4).Draw(t, "headers") {
			h := &corev3.HeaderValue{Key: str("key"), Value: str("value")}
			if rapid.IntRange(0, 4).Draw(t, "raw") == 0 {
				h.RawValue = rapid.SliceOfN(rapid.Byte(), 0, 12).Draw(t, "raw")
			}
			if oddOne("header-unknown") {
				took = true
				h.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
			}
			if i == 0 {
				r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, h)
			} else {
				r.RequestHeadersToAdd = append(r.RequestHeadersToAdd, h)
			}
		}
	}
	if rapid.Bool().Draw(t, "body") {
		r.RawBody = []byte(rapid.StringN(0, 2000, -1).Draw(t, "raw-body"))
	}
	if oddOne("metadata") {
		took = true
		r.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewStringValue("v")}}
	}
	if oddOne("quota") {
		took = true
		r.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 1}
	}
	return r, took
}

// The codec writes every RateLimitResponse with the bytes protobuf-go
// writes (or fails where it fails); appendResponse writes every response
// without the fields it leaves to protobuf-go, and none with them.
func TestEncodeResponseSameBytes(t *testing.T) {
	c := (&Service{}).ServerCodec()
	base := encoding.GetCodecV2(grpcproto.Name)
	rapid.Check(t, func(rt *rapid.T) {
		r, odd := responseGen(rt, rapid.Bool().Draw(rt, "odd"))
		if _, fast := responseSize(r); fast == odd {
			rt.Fatalf("appendResponse took it: %v, with fields it leaves to protobuf-go: %v (%v)", fast, odd, r)
		}
		got, err := c.Marshal(r)
		want, wantErr := base.Marshal(r)
		if (err != nil) != (wantErr != nil) {
			rt.Fatalf("codec error %v, protobuf-go error %v", err, wantErr)
		}
		if err == nil && !bytes.Equal(got.Materialize(), want.Materialize()) {
			rt.Fatalf("codec %x, protobuf-go %x", got.Materialize(), want.Materialize())
		}
		got.Free()
		want.Free()
	})
}

// BenchmarkMarshalResponse compares the codec with the default codec on
// the response of a request over its limit with the RateLimit headers.
func BenchmarkMarshalResponse(b *testing.B) {
	r := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "user", RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			DurationUntilReset: durationpb.New(1e9),
		}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: `"user";q=1000;w=1`}, {Key: "RateLimit", Value: `"user";r=0;t=1`}, {Key: "Retry-After", Value: "1"}},
	}
	for _, bc := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"default", encoding.GetCodecV2(grpcproto.Name)}, {"service", (&Service{}).ServerCodec()}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				out, err := bc.codec.Marshal(r)
				if err != nil {
					b.Fatal(err)
				}
				out.Free()
			}
		})
	}
}
