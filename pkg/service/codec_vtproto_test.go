//go:build vtprotobuf

package service

import (
	"bytes"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestVTMarshalSameBytes: in a -tags vtprotobuf build, where the RLS
// messages have vtprotobuf's code, the codec writes the service's
// responses with exactly the bytes of the default protobuf-go codec.
func TestVTMarshalSameBytes(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	resps := []*rlsv3.RateLimitResponse{
		{},
		{OverallCode: rlsv3.RateLimitResponse_OK},
		{
			OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
				Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "n", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR},
				LimitRemaining:     3,
				DurationUntilReset: durationpb.New(1234567891),
			}, {Code: rlsv3.RateLimitResponse_OK}},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: `"n";q=10;w=3600`}, {Key: "Retry-After", Value: "7"}},
			RequestHeadersToAdd:  []*corev3.HeaderValue{{Key: "x", Value: "y"}},
			RawBody:              []byte("body"),
			DynamicMetadata:      md,
		},
	}
	c := (&Service{}).ServerCodec()
	base := encoding.GetCodecV2(grpcproto.Name)
	for i, r := range resps {
		if _, ok := any(r).(vtMarshaler); !ok {
			t.Fatal("RateLimitResponse has no vtprotobuf code in this build")
		}
		got, err := c.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		want, err := base.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want.Materialize()) {
			t.Errorf("response %d: vtprotobuf %x, protobuf-go %x", i, got.Materialize(), want.Materialize())
		}
	}
}
