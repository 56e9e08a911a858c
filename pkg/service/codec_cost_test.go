// What decoding costs: allocations on the valid path, memory on the
// escaped path (counts and bytes, not time), and the benchmark.

package service_test

import (
	"io"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The codec path allocates fewer objects than the default codec for a
// typical valid request and for the one-entry request of the benchmark
// (decodeRequest; deterministic: allocation counts, not time).
func TestCodecValidPathAllocations(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	codec, def := e.svc.ServerCodec(), encoding.GetCodecV2(grpcproto.Name)
	for _, b := range [][]byte{typicalRequest(), rawReq("bench", "user", "user-42")} {
		run := func(c encoding.CodecV2) float64 {
			return testing.AllocsPerRun(200, func() {
				if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &rlsv3.RateLimitRequest{}); err != nil {
					t.Fatal(err)
				}
			})
		}
		if got, want := run(codec), run(def); got >= want {
			t.Errorf("codec allocates %v per valid request %x, default codec %v", got, b, want)
		}
	}
}

// typicalRequest is what Envoy sends for a route with three actions:
// remote address, a header and a generic key.
func typicalRequest() []byte {
	b, err := proto.Marshal(req("svc",
		d("remote_address", "203.0.113.7"),
		d("header_match", "api", "user", "f3a9c2d1-7b4e-4e0a-9c61-2d5f8e1a0b37"),
		d("generic_key", "checkout")))
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkUnmarshal compares the service codec with the default codec on
// a typical valid request, and shows the cost of the escaped path.
func BenchmarkUnmarshal(b *testing.B) {
	svc, err := service.New(service.Options{Store: newReferenceStore(&clock{now: t0}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	valid := typicalRequest()
	invalid := rawReq("svc", "remote_address", "203.0.113.7", "user", "f3a9c2d1\xff", "generic_key", "checkout")
	for _, bc := range []struct {
		name  string
		codec encoding.CodecV2
		in    []byte
	}{
		{"default/valid", encoding.GetCodecV2(grpcproto.Name), valid},
		{"service/valid", svc.ServerCodec(), valid},
		{"service/invalid-utf8", svc.ServerCodec(), invalid},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bc.in)}, &rlsv3.RateLimitRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// hostileRequest is a request of 64 descriptors of 32 entries whose values
// are each valueLen bytes, all of them invalid UTF-8 when invalid is set
// (else ASCII): the most nested invalid strings the request bounds allow.
func hostileRequest(valueLen int, invalid bool) []byte {
	c := byte('a')
	if invalid {
		c = 0xff
	}
	v := strings.Repeat(string([]byte{c}), valueLen)
	r := wReq{domain: "svc"}
	for range service.MaxDescriptors {
		var d wDesc
		for j := range service.MaxEntries {
			d.entries = append(d.entries, wEntry{"k" + string(rune('a'+j%26)), v})
		}
		r.descs = append(r.descs, d)
	}
	return r.wire()
}

// allocatedBytes is the heap bytes one call of f allocates, averaged over
// runs calls (runtime.MemStats.TotalAlloc; deterministic for f, unlike
// time or RSS).
func allocatedBytes(runs int, f func()) float64 {
	f() // warm pools
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(runs)
}

// Decoding a request with invalid UTF-8 in every nested value allocates
// memory proportional to its size, in one pass: the decoded message (whose
// escaped strings take 2 bytes per raw byte) plus one contiguous copy of
// the input and one rewritten copy (about twice its size), not a copy per
// nesting level: at most 3.5 bytes beyond the message per request byte,
// at every value size.
func TestInvalidUTF8DecodeMemoryBounded(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	codec, def := e.svc.ServerCodec(), encoding.GetCodecV2(grpcproto.Name)
	for _, valueLen := range []int{16, 128, 480} {
		bad, good := hostileRequest(valueLen, true), hostileRequest(2*valueLen+3, false)
		decode := func(c encoding.CodecV2, b []byte) func() {
			return func() {
				if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &rlsv3.RateLimitRequest{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		// good decodes to a message of the same shape and string sizes as
		// bad after escaping: what any decoder of bad must allocate.
		message := allocatedBytes(10, decode(def, good))
		got := allocatedBytes(10, decode(codec, bad))
		extra := got - message
		t.Logf("values of %d bytes: request %d bytes, decoded message %.0f bytes, codec %.0f bytes (%.2f x the request beyond the message)",
			valueLen, len(bad), message, got, extra/float64(len(bad)))
		if extra > 3.5*float64(len(bad)) {
			t.Errorf("values of %d bytes: the codec allocates %.0f bytes beyond the decoded message for a %d-byte request (%.2f x), want at most 3.5 x",
				valueLen, extra, len(bad), extra/float64(len(bad)))
		}
	}
}
