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

// referenceError is the error envoyproxy/ratelimit returns for a request
// it refuses: a plain error, which gRPC sends as codes.Unknown with the
// message as is.
func referenceError(msg string) error { return status.Error(codes.Unknown, msg) }

// validateRequest checks the shape of a request before any matching:
// non-empty domain, 1..MaxDescriptors descriptors, each with
// 1..MaxEntries entries with a non-empty key, every string at most
// MaxValueBytes, and a limit override (if any) with a known unit. With
// ref (Options.ReferenceAnswers) a descriptor may have no entries and
// entries may have empty keys, and an empty domain or descriptor list is
// the reference's codes.Unknown error.
func validateRequest(req *rlsv3.RateLimitRequest, ref bool) error {
	if req == nil {
		return invalid("rate limit request must not be nil")
	}
	if req.GetDomain() == "" {
		if ref {
			return referenceError("rate limit domain must not be empty")
		}
		return invalid("rate limit domain must not be empty")
	}
	if n := len(req.GetDomain()); n > MaxValueBytes {
		return invalid("rate limit domain is %d bytes, more than the bound of %d", n, MaxValueBytes)
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		if ref {
			return referenceError("rate limit descriptor list must not be empty")
		}
		return invalid("rate limit descriptor list must not be empty")
	}
	if len(ds) > MaxDescriptors {
		return invalid("%d descriptors, more than the bound of %d per request", len(ds), MaxDescriptors)
	}
	for i, d := range ds {
		es := d.GetEntries()
		if len(es) == 0 && !ref {
			return invalid("descriptor %d has no entries", i)
		}
		if len(es) > MaxEntries {
			return invalid("descriptor %d has %d entries, more than the bound of %d", i, len(es), MaxEntries)
		}
		for j, e := range es {
			if e.GetKey() == "" && !ref {
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

// overrideUnit maps a RateLimitOverride unit (envoy.type.v3.RateLimitUnit,
// which has no WEEK) to a policy.Unit. UNKNOWN and out-of-range values are
// errors.
func overrideUnit(l *rlcommon.RateLimitDescriptor_RateLimitOverride) (policy.Unit, error) {
	switch l.GetUnit() {
	case typev3.RateLimitUnit_SECOND:
		return policy.Second, nil
	case typev3.RateLimitUnit_MINUTE:
		return policy.Minute, nil
	case typev3.RateLimitUnit_HOUR:
		return policy.Hour, nil
	case typev3.RateLimitUnit_DAY:
		return policy.Day, nil
	case typev3.RateLimitUnit_MONTH:
		return policy.Month, nil
	case typev3.RateLimitUnit_YEAR:
		return policy.Year, nil
	}
	return policy.UnitUnknown, fmt.Errorf("limit override unit %v is invalid (want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", l.GetUnit())
}

// responseUnit maps a policy.Unit to the RateLimitResponse.RateLimit.Unit
// enum (which, unlike envoy.type.v3.RateLimitUnit, has WEEK = 7).
func responseUnit(u policy.Unit) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch u {
	case policy.Second:
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case policy.Minute:
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case policy.Hour:
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case policy.Day:
		return rlsv3.RateLimitResponse_RateLimit_DAY
	case policy.Week:
		return rlsv3.RateLimitResponse_RateLimit_WEEK
	case policy.Month:
		return rlsv3.RateLimitResponse_RateLimit_MONTH
	case policy.Year:
		return rlsv3.RateLimitResponse_RateLimit_YEAR
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
