// The codec against its specification: a model of the decoding, and the
// fuzz target.

package service_test

import (
	"io"
	"log/slog"
	"testing"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The codec's decoding of arbitrary requests built field by field agrees
// with the spec: every string that is not valid UTF-8 escaped, everything
// else (limit override, both hits_addend, is_negative_hits) as sent; for
// all-valid input it equals proto.Unmarshal.
func TestCodecAgreesWithModel(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	codec := e.svc.ServerCodec()
	str := rapid.OneOf(
		rapid.StringMatching(`[a-z]{0,6}`),
		rapid.Custom(func(t *rapid.T) string { return string(rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(t, "raw")) }),
		rapid.SampledFrom([]string{"\xff", "a\x80", "\xc3", "\xed\xa0\x80", "\u00ff", "\uFFFD", "ok"}),
	)
	rapid.Check(t, func(rt *rapid.T) {
		r := wReq{domain: str.Draw(rt, "domain"), hits: rapid.Uint32Range(0, 3).Draw(rt, "hits")}
		for range rapid.IntRange(0, 3).Draw(rt, "descs") {
			var d wDesc
			for range rapid.IntRange(0, 3).Draw(rt, "entries") {
				d.entries = append(d.entries, wEntry{str.Draw(rt, "key"), str.Draw(rt, "value")})
			}
			if rapid.Bool().Draw(rt, "limit") {
				d.limit = &[2]uint64{uint64(rapid.Uint32().Draw(rt, "rpu")), uint64(rapid.IntRange(0, 6).Draw(rt, "unit"))}
			}
			if rapid.Bool().Draw(rt, "dhits") {
				h := rapid.Uint64().Draw(rt, "dhitsv")
				d.hits = &h
			}
			d.negative = rapid.Bool().Draw(rt, "negative")
			r.descs = append(r.descs, d)
		}
		b := r.wire()
		got := &rlsv3.RateLimitRequest{}
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got); err != nil {
			rt.Fatalf("codec: %v", err)
		}
		if want := r.want(); !proto.Equal(got, want) {
			rt.Fatalf("codec decoded %v, want %v", got, want)
		}
		std := &rlsv3.RateLimitRequest{}
		if err := proto.Unmarshal(b, std); err == nil && !proto.Equal(got, std) {
			rt.Fatalf("valid input: codec %v, proto.Unmarshal %v", got, std)
		}
	})
}

// FuzzServerCodec: the codec never panics; for input the default codec
// accepts it agrees with proto.Unmarshal; whatever it accepts has only
// valid UTF-8 strings and marshals again; and appending a field with an
// invalid UTF-8 domain, key or value to accepted input (whatever wire forms
// it uses: unknown fields, groups, repeated fields, non-minimal varints)
// yields proto.Unmarshal's message with that one string escaped.
func FuzzServerCodec(f *testing.F) {
	over := d("small", "s")
	over.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE}
	seeds := [][]byte{typicalRequest(), rawReq("svc\xff", "k", "v\xfe"), wReq{domain: "svc", hits: 3, descs: []wDesc{{entries: []wEntry{{"a", "b\x80"}}, negative: true}}}.wire()}
	if b, err := proto.Marshal(req("svc", over, withHits(d("user", "u"), 0))); err == nil {
		seeds = append(seeds, b)
	}
	// unknown fields, a group and a non-minimal varint tag for the domain.
	seeds = append(seeds, append(typicalRequest(), 0x28, 0x01, 0x33, 0x08, 0x01, 0x34, 0x8a, 0x00, 0x01, 0x61))
	// known string fields with another wire type (proto keeps them as
	// unknown fields): the domain as a varint; an entry key as fixed32.
	seeds = append(seeds, append(typicalRequest(), 0x08, 0x05))
	seeds = append(seeds, append(typicalRequest(), 0x12, 0x0c, 0x0a, 0x08, 0x0d, 1, 2, 3, 4, 0x12, 0x01, 'v', 0x20, 0x01))
	for i, s := range seeds {
		f.Add(s, uint8(i), []byte("\xff"))
	}
	f.Add([]byte{}, uint8(0), []byte("a\xc0b"))
	codec := func() encoding.CodecV2 {
		svc, err := service.New(service.Options{Store: newReferenceStore(&clock{now: t0}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			f.Fatal(err)
		}
		return svc.ServerCodec()
	}()
	unmarshal := func(b []byte) (*rlsv3.RateLimitRequest, error) {
		m := &rlsv3.RateLimitRequest{}
		return m, codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
	}
	f.Fuzz(func(t *testing.T, data []byte, which uint8, bad []byte) {
		std := &rlsv3.RateLimitRequest{}
		stdErr := proto.Unmarshal(data, std)
		got, err := unmarshal(data)
		if stdErr == nil {
			if err != nil || !proto.Equal(got, std) {
				t.Fatalf("valid input: codec (%v, %v), proto.Unmarshal %v", got, err, std)
			}
		}
		if err == nil {
			checkUTF8(t, got)
			if _, err := proto.Marshal(got); err != nil {
				t.Fatalf("accepted message does not marshal: %v", err)
			}
		}
		if stdErr != nil || utf8.Valid(bad) {
			return
		}
		want := proto.Clone(std).(*rlsv3.RateLimitRequest)
		var ext []byte
		switch which % 3 {
		case 0:
			want.Domain = escaped(string(bad))
			ext = protowire.AppendTag(ext, 1, protowire.BytesType)
			ext = protowire.AppendBytes(ext, bad)
		case 1:
			want.Descriptors = append(want.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: escaped(string(bad))}}})
			ext = protowire.AppendTag(ext, 2, protowire.BytesType)
			ext = protowire.AppendBytes(ext, wDesc{entries: []wEntry{{string(bad), ""}}}.wire())
		case 2:
			want.Descriptors = append(want.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: escaped(string(bad))}}})
			ext = protowire.AppendTag(ext, 2, protowire.BytesType)
			ext = protowire.AppendBytes(ext, wDesc{entries: []wEntry{{"k", string(bad)}}}.wire())
		}
		got, err = unmarshal(append(append([]byte{}, data...), ext...))
		if err != nil || !proto.Equal(got, want) {
			t.Fatalf("with %q appended (case %d): codec (%v, %v), want %v", bad, which%3, got, err, want)
		}
	})
}

func checkUTF8(t *testing.T, r *rlsv3.RateLimitRequest) {
	t.Helper()
	ok := utf8.ValidString(r.GetDomain())
	for _, d := range r.GetDescriptors() {
		for _, e := range d.GetEntries() {
			ok = ok && utf8.ValidString(e.GetKey()) && utf8.ValidString(e.GetValue())
		}
	}
	if !ok {
		t.Fatalf("decoded message has invalid UTF-8: %q", r)
	}
}
