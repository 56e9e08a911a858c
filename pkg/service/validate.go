package service

import (
	"fmt"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Bounds on a RateLimitRequest. A request over any bound is rejected with
// codes.InvalidArgument naming the bound (docs/responses.md, "Errors").
const (
	// MaxDescriptors is the maximum number of descriptors per request.
	MaxDescriptors = 64
	// MaxEntries is the maximum number of entries per descriptor.
	MaxEntries = 32
	// MaxValueBytes is the maximum length in bytes of the domain, of an
	// entry key and of an entry value. Only values are client-controlled
	// (Envoy copies header values into them), and an InvalidArgument makes
	// Envoy fail open by default: the bound is above Envoy's default
	// max_request_headers_kb (60 KiB), so no header Envoy accepts by default
	// can switch the limits of its request off. Values are hashed in keys,
	// so their length costs nothing in the store.
	MaxValueBytes = 64 << 10
)

// invalid returns a gRPC InvalidArgument status error.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "service: "+format, args...)
}

// validateRequest checks the shape of a request before any matching:
// non-empty domain, 1..MaxDescriptors descriptors, each with
// 1..MaxEntries entries with a non-empty key, every string at most
// MaxValueBytes, and a limit override (if any) with a known unit. The
// answer policy a says whether a descriptor may have no entries and an
// entry an empty key, and what an empty domain or descriptor list fails
// with.
func validateRequest(req *rlsv3.RateLimitRequest, a answerPolicy) error {
	if req == nil {
		return invalid("rate limit request must not be nil")
	}
	if req.GetDomain() == "" {
		return a.emptyRequest("rate limit domain must not be empty")
	}
	if n := len(req.GetDomain()); n > MaxValueBytes {
		return invalid("rate limit domain is %d bytes, more than the bound of %d", n, MaxValueBytes)
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return a.emptyRequest("rate limit descriptor list must not be empty")
	}
	if len(ds) > MaxDescriptors {
		return invalid("%d descriptors, more than the bound of %d per request", len(ds), MaxDescriptors)
	}
	for i, d := range ds {
		es := d.GetEntries()
		if len(es) == 0 && !a.emptyEntries() {
			return invalid("descriptor %d has no entries", i)
		}
		if len(es) > MaxEntries {
			return invalid("descriptor %d has %d entries, more than the bound of %d", i, len(es), MaxEntries)
		}
		for j, e := range es {
			if e.GetKey() == "" && !a.emptyEntries() {
				return invalid("descriptor %d entry %d: key must not be empty", i, j)
			}
			if n := rawLen(e.GetKey()); n > MaxValueBytes {
				return invalid("descriptor %d entry %d: key is %d bytes, more than the bound of %d", i, j, n, MaxValueBytes)
			}
			if n := rawLen(e.GetValue()); n > MaxValueBytes {
				return invalid("descriptor %d entry %d: value is %d bytes, more than the bound of %d", i, j, n, MaxValueBytes)
			}
		}
		if l := d.GetLimit(); l != nil {
			if _, err := overrideUnit(l); err != nil {
				return invalid("descriptor %d: %v", i, err)
			}
		}
	}
	return nil
}

// overrideUnits maps envoy.type.v3.RateLimitUnit, which has no WEEK, to
// policy.Unit (UnitUnknown for UNKNOWN).
var overrideUnits = [...]policy.Unit{
	typev3.RateLimitUnit_SECOND: policy.Second,
	typev3.RateLimitUnit_MINUTE: policy.Minute,
	typev3.RateLimitUnit_HOUR:   policy.Hour,
	typev3.RateLimitUnit_DAY:    policy.Day,
	typev3.RateLimitUnit_MONTH:  policy.Month,
	typev3.RateLimitUnit_YEAR:   policy.Year,
}

// overrideUnit maps a RateLimitOverride unit (envoy.type.v3.RateLimitUnit)
// to a policy.Unit. UNKNOWN and out-of-range values are errors.
func overrideUnit(l *rlcommon.RateLimitDescriptor_RateLimitOverride) (policy.Unit, error) {
	if u := l.GetUnit(); u >= 0 && int(u) < len(overrideUnits) && overrideUnits[u] != policy.UnitUnknown {
		return overrideUnits[u], nil
	}
	return policy.UnitUnknown, fmt.Errorf("limit override unit %v is invalid (want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", l.GetUnit())
}

// responseUnits maps policy.Unit to the RateLimitResponse.RateLimit.Unit
// enum (which, unlike envoy.type.v3.RateLimitUnit, has WEEK = 7).
var responseUnits = [...]rlsv3.RateLimitResponse_RateLimit_Unit{
	policy.Second: rlsv3.RateLimitResponse_RateLimit_SECOND,
	policy.Minute: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	policy.Hour:   rlsv3.RateLimitResponse_RateLimit_HOUR,
	policy.Day:    rlsv3.RateLimitResponse_RateLimit_DAY,
	policy.Week:   rlsv3.RateLimitResponse_RateLimit_WEEK,
	policy.Month:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	policy.Year:   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// responseUnit maps a policy.Unit to the RateLimitResponse.RateLimit.Unit
// enum; UNKNOWN for UnitUnknown and out-of-range values.
func responseUnit(u policy.Unit) rlsv3.RateLimitResponse_RateLimit_Unit {
	if int(u) < len(responseUnits) {
		return responseUnits[u]
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// rawLen is the length in bytes of s as the client sent it: the lenient
// decoder replaces a string that is not valid UTF-8 by its escaped form
// (InvalidUTF8Prefix and two hex digits per byte, codec.go), which must
// not make a value within MaxValueBytes exceed it. A valid string spelled
// like an escaped form counts as its decoded length too, at most half its
// bytes: the bound stays within a factor of two.
func rawLen(s string) int {
	rest, ok := strings.CutPrefix(s, InvalidUTF8Prefix)
	if !ok || len(rest)%2 != 0 {
		return len(s)
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return len(s)
		}
	}
	return len(rest) / 2
}
