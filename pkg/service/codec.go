package service

import (
	"encoding/hex"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// InvalidUTF8Prefix starts the escaped form of a string field that is not
// valid UTF-8: the escaped form is InvalidUTF8Prefix followed by the
// lowercase hex of the raw bytes, e.g. the value "a\xff" becomes
// "\uFFFD61ff". Two different raw strings never share an escaped form, and
// an escaped form differs from every valid string except one that is
// literally spelled that way (a client sending the literal "\uFFFD61ff"
// shares its counters with a client sending "a\xff").
const InvalidUTF8Prefix = "\uFFFD"

// rateLimitRequestDesc is the descriptor the lenient decoder walks.
var rateLimitRequestDesc = (&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor()

// maxEscapeDepth bounds the message nesting the lenient decoder walks
// (RateLimitRequest → RateLimitDescriptor → Entry is 3 deep).
const maxEscapeDepth = 32

// ServerCodec returns the gRPC server codec of the service: the default
// protobuf codec ("proto", registered by google.golang.org/grpc/encoding/proto),
// except that a RateLimitRequest that fails to unmarshal only because a
// string field (domain, descriptor entry key or value) holds invalid UTF-8
// is decoded with each such string replaced by its escaped form
// (InvalidUTF8Prefix + lowercase hex of the raw bytes) instead of failing
// the call with codes.Internal. proto3 string fields must be valid UTF-8
// and protobuf-go rejects the whole message otherwise; Envoy forwards
// HTTP/1 obs-text header bytes (>= 0x80) into request_headers descriptor
// values, so without this codec one such header would make every
// descriptor of the request go unevaluated (and, with Envoy's default
// failure_mode_deny: false, allowed).
//
// Every such request increments ratelimitd_invalid_utf8_requests_total.
// Wire data that is malformed for any other reason fails with the default
// codec's error. Other message types (the responses, gRPC health, ...)
// go through the default codec unchanged.
func (s *Service) ServerCodec() encoding.CodecV2 {
	base := encoding.GetCodecV2(grpcproto.Name)
	return &serverCodec{base: base, s: s}
}

// ServerOption returns grpc.ForceServerCodecV2(s.ServerCodec()): pass it to
// grpc.NewServer for the server that registers the service. It applies to
// every service on that server; those see the default protobuf codec.
func (s *Service) ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(s.ServerCodec())
}

type serverCodec struct {
	base encoding.CodecV2
	s    *Service
}

// Name is the default codec's name ("proto"): the codec serves the same
// content-subtype.
func (c *serverCodec) Name() string { return grpcproto.Name }

// vtMarshaler is the marshalling code vtprotobuf generates: go-control-plane
// ships it for the RLS messages (in its generated ratelimit/v3 package)
// behind the build tag vtprotobuf, so a binary built with -tags vtprotobuf
// has it.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(dAtA []byte) (int, error)
}

// Marshal writes a RateLimitResponse of the shapes the service builds with
// appendResponse (wire.go: the same bytes as protobuf-go, without
// reflection; TestEncodeResponseSameBytes), any other RateLimitResponse
// with protobuf-go, other messages with their
// vtprotobuf code when they have one (the RLS messages in a -tags
// vtprotobuf build; TestVTMarshalSameBytes), else with the default codec's
// Marshal.
func (c *serverCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*rlsv3.RateLimitResponse); ok {
		if size, ok := responseSize(r); ok {
			return marshalSized(size, func(b []byte) []byte { return appendResponse(b, r) }), nil
		}
		// protobuf-go, which rejects invalid UTF-8 where vtprotobuf's
		// code would write it.
		return c.base.Marshal(v)
	}
	m, ok := v.(vtMarshaler)
	if !ok {
		return c.base.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVTStrict(buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVTStrict((*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// marshalSized returns the size bytes that write appends to an empty
// slice of that capacity: in a buffer of its own when small (grpc-go pools
// only larger ones), else in one from grpc-go's default pool.
func marshalSized(size int, write func([]byte) []byte) mem.BufferSlice {
	if mem.IsBelowBufferPoolingThreshold(size) {
		return mem.BufferSlice{mem.SliceBuffer(write(make([]byte, 0, size)))}
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = write((*buf)[:0])
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}
}

// Unmarshal decodes a RateLimitRequest of the usual shapes with
// decodeRequest (wire.go), and everything else with the default codec's
// Unmarshal, then, for a RateLimitRequest that failed, the lenient
// decoding described on ServerCodec.
func (c *serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData() // read only; valid until Unmarshal returns
	} else {
		b = data.Materialize()
	}
	req.Reset()
	if decodeRequest(b, req) {
		return nil
	}
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	if !unmarshalEscaped(b, req) {
		return err
	}
	c.s.m.invalidUTF8.Inc()
	if ok, n := c.s.errLog.Allow("codec:invalid_utf8", c.s.opts.Now()); ok {
		c.s.opts.Logger.Warn("service: RateLimitRequest with invalid UTF-8 strings decoded with the strings escaped",
			"domain", req.GetDomain(), "suppressed", n)
	}
	return nil
}

// unmarshalEscaped decodes b into req after replacing every string field
// of b that is not valid UTF-8 by its escaped form. It reports false (req
// then holds garbage) when b has no such string, when b is not
// well-formed along the walked fields, or when the rewritten message
// still fails to unmarshal.
//
// Memory: one rewritten copy of b, exactly sized (escapedSize: at most
// 2 x len(b) + 3 bytes per string), plus the decoded message; the walk
// itself allocates nothing, at any nesting depth. (A pooled buffer would
// round the copy up to grpc-go's next buffer tier, up to 1 MiB for a
// 33 KiB request, which many concurrent requests would hold at once.) Time: each nesting level is
// sized once more by its parent, so a walk reads b at most depth+1 times
// (3 levels for RateLimitRequest → RateLimitDescriptor → Entry).
func unmarshalEscaped(b []byte, req *rlsv3.RateLimitRequest) bool {
	n, changed, ok := escapedSize(b, rateLimitRequestDesc, 0)
	if !ok || !changed {
		return false
	}
	out := appendEscaped(make([]byte, 0, n), b, rateLimitRequestDesc)
	return proto.Unmarshal(out, req) == nil
}

// escapeField classifies the field of type md numbered num with wire type
// typ: a string field that must hold valid UTF-8, a message field, or
// neither (copied byte for byte: other kinds, unknown fields, unexpected
// wire types).
func escapeField(md protoreflect.MessageDescriptor, num protowire.Number, typ protowire.Type) (str bool, sub protoreflect.MessageDescriptor) {
	fd := md.Fields().ByNumber(num)
	if fd == nil || typ != protowire.BytesType {
		return false, nil
	}
	switch {
	case fd.Kind() == protoreflect.StringKind && validatesUTF8(fd):
		return true, nil
	case fd.Kind() == protoreflect.MessageKind:
		return false, fd.Message()
	}
	return false, nil
}

// escapedSize walks the wire form b of a message of type md and returns
// the length of b with every string field whose bytes are not valid UTF-8
// replaced by escapeInvalidUTF8 of those bytes, recursing into message
// fields (singular, repeated and map entries). changed reports whether
// anything would be replaced. ok is false for wire data that is malformed
// (bad tag, truncated value, invalid group) or nested deeper than
// maxEscapeDepth. It allocates nothing.
func escapedSize(b []byte, md protoreflect.MessageDescriptor, depth int) (n int, changed, ok bool) {
	if depth > maxEscapeDepth {
		return 0, false, false
	}
	for i := 0; i < len(b); {
		num, typ, tn := protowire.ConsumeTag(b[i:])
		if tn < 0 {
			return 0, false, false
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[i+tn:])
		if vn < 0 {
			return 0, false, false
		}
		size := tn + vn
		if str, sub := escapeField(md, num, typ); str || sub != nil {
			v, _ := protowire.ConsumeBytes(b[i+tn : i+tn+vn])
			switch {
			case str && !utf8.Valid(v):
				size, changed = tn+protowire.SizeBytes(escapedLen(len(v))), true
			case sub != nil:
				m, c, ok := escapedSize(v, sub, depth+1)
				if !ok {
					return 0, false, false
				}
				if c {
					size, changed = tn+protowire.SizeBytes(m), true
				}
			}
		}
		n += size
		i += tn + vn
	}
	return n, changed, true
}

// appendEscaped appends to dst the wire form b of a message of type md
// rewritten as escapedSize measures it; b must be one escapedSize
// reported ok for. Unchanged fields are copied byte for byte, changed
// ones keep their original tag.
func appendEscaped(dst, b []byte, md protoreflect.MessageDescriptor) []byte {
	for i := 0; i < len(b); {
		num, typ, tn := protowire.ConsumeTag(b[i:])
		vn := protowire.ConsumeFieldValue(num, typ, b[i+tn:])
		field := b[i : i+tn+vn]
		i += tn + vn
		str, sub := escapeField(md, num, typ)
		if !str && sub == nil {
			dst = append(dst, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[tn:])
		switch {
		case str && !utf8.Valid(v):
			dst = append(dst, field[:tn]...)
			dst = protowire.AppendVarint(dst, uint64(escapedLen(len(v))))
			dst = escapeInvalidUTF8(dst, v)
		case sub != nil:
			m, c, _ := escapedSize(v, sub, 0)
			if !c {
				dst = append(dst, field...)
				continue
			}
			dst = append(dst, field[:tn]...)
			dst = protowire.AppendVarint(dst, uint64(m))
			dst = appendEscaped(dst, v, sub)
		default:
			dst = append(dst, field...)
		}
	}
	return dst
}

// escapedLen is the length of the escaped form of n raw bytes.
func escapedLen(n int) int { return len(InvalidUTF8Prefix) + 2*n }

// validatesUTF8 reports whether protobuf-go rejects invalid UTF-8 in the
// string field fd: proto3 (and editions, whose default utf8_validation is
// VERIFY) but not proto2.
func validatesUTF8(fd protoreflect.FieldDescriptor) bool {
	return fd.ParentFile().Syntax() != protoreflect.Proto2
}

// escapeInvalidUTF8 appends the escaped form of raw to dst:
// InvalidUTF8Prefix followed by the lowercase hex of raw.
func escapeInvalidUTF8(dst, raw []byte) []byte {
	dst = append(dst, InvalidUTF8Prefix...)
	return hex.AppendEncode(dst, raw)
}

// validUTF8 returns s when it is valid UTF-8, else its escaped form (see
// InvalidUTF8Prefix). The service applies it where request values reach a
// metric label or the response, for callers that bypass the gRPC codec
// (in-process ShouldRateLimit calls).
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(escapeInvalidUTF8(nil, []byte(s)))
}

var _ encoding.CodecV2 = (*serverCodec)(nil)
