package testproc

import (
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Desc is a RateLimitDescriptor (envoy.extensions.common.ratelimit.v3)
// whose entries are the key, value pairs of kv in order; an odd last
// element is ignored.
func Desc(kv ...string) *rlcommon.RateLimitDescriptor {
	out := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// WithHits sets the descriptor's own hits_addend (the
// RateLimitDescriptor.hits_addend field; 0 is a check that consumes
// nothing) and returns d.
func WithHits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}
