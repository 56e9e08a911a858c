package service

import (
	"math"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// ceilSeconds rounds d up to whole seconds (0 for d <= 0).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func atLeast1(n int64) int64 { return max(n, 1) }

func clampU32(n int64) uint32 {
	switch {
	case n < 0:
		return 0
	case n > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(n)
}

// status builds the DescriptorStatus of one descriptor (docs/responses.md,
// "statuses[i]": statuses without a counted limit, several limits on one
// node).
func (s *Service) status(st *descState, decs []algo.Decision, outs []outcome, p *statusParts) *rlsv3.RateLimitResponse_DescriptorStatus {
	ds := &p.status
	ds.Code = rlsv3.RateLimitResponse_OK
	st.status = ds
	if !st.matched {
		return ds
	}
	if st.match.Rule.Unlimited {
		ds.LimitRemaining = math.MaxUint32
		return ds
	}
	if len(st.applied) == 0 {
		return ds
	}
	a := reported(st, decs, outs)
	d := decs[a.hit]
	ds.CurrentLimit = currentLimit(a.spec, &p.limit)
	ds.LimitRemaining = clampU32(s.answers.remaining(d))
	if st.denied && st.quota && !st.shadow && !s.answers.quotaDenies() {
		// The pinned reference answers an over-limit quota descriptor OK
		// with no duration_until_reset; only its metadata tells.
		return ds
	}
	if st.denied && !st.shadow {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	reset := d.ResetAfter
	if outs[a.hit] == byFailedOpen {
		reset = window(a.spec)
	}
	ds.DurationUntilReset = setDuration(&p.duration, time.Duration(atLeast1(ceilSeconds(reset)))*time.Second)
	return ds
}

// setDuration sets p to d as durationpb.New does and returns p.
func setDuration(p *durationpb.Duration, d time.Duration) *durationpb.Duration {
	nanos := d.Nanoseconds()
	p.Seconds = nanos / 1e9
	p.Nanos = int32(nanos % 1e9)
	return p
}

// statusParts are the messages of one DescriptorStatus, allocated together.
type statusParts struct {
	status   rlsv3.RateLimitResponse_DescriptorStatus
	limit    rlsv3.RateLimitResponse_RateLimit
	duration durationpb.Duration
}

// blockHeaders is the number of response headers a responseBlock holds
// without allocating (RateLimit-Policy, RateLimit, Retry-After,
// Content-Type; more allocate).
const blockHeaders = 4

// responseBlock is a response with the messages a one-descriptor answer
// needs, allocated in one piece; the response points into it.
type responseBlock struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	parts    [1]statusParts
	more     []statusParts // parts of the descriptors after the first
	hv       [blockHeaders]corev3.HeaderValue
	hp       [blockHeaders]*corev3.HeaderValue
}

// newResponseBlock returns a block whose resp.Statuses has n (nil) entries.
func newResponseBlock(n int) *responseBlock {
	b := &responseBlock{}
	if n <= len(b.statuses) {
		b.resp.Statuses = b.statuses[:n]
	} else {
		b.resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
		b.more = make([]statusParts, n-1)
	}
	return b
}

// statusParts returns the parts of descriptor i.
func (b *responseBlock) statusParts(i int) *statusParts {
	if i == 0 {
		return &b.parts[0]
	}
	return &b.more[i-1]
}

// reported picks the limit a descriptor's status reports: the first that
// denied, else the least remaining (ties: config order). Failed-open
// limits (state unknown) are reported only when nothing else applied.
func reported(st *descState, decs []algo.Decision, outs []outcome) applied {
	best := -1
	for i, a := range st.applied {
		if !decs[a.hit].Allowed {
			return a
		}
		if outs[a.hit] == byFailedOpen {
			continue
		}
		if best < 0 || decs[a.hit].Remaining < decs[st.applied[best].hit].Remaining {
			best = i
		}
	}
	if best < 0 {
		best = 0
	}
	return st.applied[best]
}

// currentLimit fills rl with the Spec's limit and returns it.
func currentLimit(sp *policy.Spec, rl *rlsv3.RateLimitResponse_RateLimit) *rlsv3.RateLimitResponse_RateLimit {
	rl.Name = sp.Name
	rl.RequestsPerUnit = sp.RequestsPerUnit
	rl.Unit = responseUnit(sp.Unit)
	if sp.UnitMultiplier > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(sp.UnitMultiplier)
	}
	return rl
}

// window is the quota window of a Spec (w=): Spec.Window, else the
// algorithm period.
func window(sp *policy.Spec) time.Duration {
	if sp.Window > 0 {
		return sp.Window
	}
	return sp.Limit.Period
}

// capacity is the number of units a full state admits: the token bucket
// burst, else the rate.
func capacity(l algo.Limit) int64 {
	if l.Kind == algo.TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// nearLimit reports an allowed decision that leaves the used share above
// floor(capacity × ratio) (envoyproxy/ratelimit's near_limit threshold).
func (s *Service) nearLimit(sp *policy.Spec, d algo.Decision) bool {
	c := capacity(sp.Limit)
	if !d.Allowed || c <= 0 {
		return false
	}
	threshold := int64(math.Floor(float64(c) * s.opts.NearLimitRatio))
	return c-d.Remaining > threshold
}
