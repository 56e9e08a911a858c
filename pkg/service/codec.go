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

// Marshal is the default codec's Marshal.
func (c *serverCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

// Unmarshal is the default codec's Unmarshal, then, for a RateLimitRequest
// that failed, the lenient decoding described on ServerCodec.
func (c *serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return err
	}
	if !unmarshalEscaped(data.Materialize(), req) {
		return err
	}
	c.s.m.invalidUTF8.Inc()
	if ok, n := c.s.errLog.allow("codec:invalid_utf8", c.s.opts.Now()); ok {
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
func unmarshalEscaped(b []byte, req *rlsv3.RateLimitRequest) bool {
	out, changed, ok := escapeInvalidStrings(b, rateLimitRequestDesc, 0)
	if !ok || !changed {
		return false
	}
	return proto.Unmarshal(out, req) == nil
}

// escapeInvalidStrings walks the wire form b of a message of type md and
// returns it with every string field whose bytes are not valid UTF-8
// replaced by escapeInvalidUTF8 of those bytes, recursing into message
// fields (singular, repeated and map entries). Other fields, unknown
// fields and fields with an unexpected wire type are copied byte for byte.
// changed reports whether anything was replaced (out is then a new slice;
// otherwise out is b). ok is false for wire data that is malformed (bad
// tag, truncated value, invalid group) or nested deeper than
// maxEscapeDepth.
func escapeInvalidStrings(b []byte, md protoreflect.MessageDescriptor, depth int) (out []byte, changed, ok bool) {
	if depth > maxEscapeDepth {
		return nil, false, false
	}
	fields := md.Fields()
	for i := 0; i < len(b); {
		start := i
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return nil, false, false
		}
		i += n
		m := protowire.ConsumeFieldValue(num, typ, b[i:])
		if m < 0 {
			return nil, false, false
		}
		i += m
		fd := fields.ByNumber(num)
		var repl []byte
		replaced := false
		if fd != nil && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[start+n : i])
			switch {
			case fd.Kind() == protoreflect.StringKind && validatesUTF8(fd):
				if !utf8.Valid(v) {
					repl, replaced = escapeInvalidUTF8(nil, v), true
				}
			case fd.Kind() == protoreflect.MessageKind:
				r, c, ok := escapeInvalidStrings(v, fd.Message(), depth+1)
				if !ok {
					return nil, false, false
				}
				repl, replaced = r, c
			}
		}
		switch {
		case replaced:
			if out == nil {
				out = make([]byte, 0, len(b)+len(b)/2+len(InvalidUTF8Prefix))
				out = append(out, b[:start]...)
			}
			out = append(out, b[start:start+n]...) // the original tag
			out = protowire.AppendBytes(out, repl)
		case out != nil:
			out = append(out, b[start:i]...)
		}
	}
	if out == nil {
		return b, false, true
	}
	return out, true, true
}

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
