package rlqs

import (
	"cmp"
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// milli is the allocator's resolution: shares and demand are counted in
// thousandths of a unit per window, so that a limit smaller than the number
// of streams still divides.
const milli = 1000

// share is one stream's assignment for one limit: a token bucket of
// maxTokens that refills rate milli-units per window, or deny.
type share struct {
	deny      bool
	maxTokens int64 // tokens
	rate      int64 // milli-units per window
	window    time.Duration
}

// plan is the division of one limit among the fleet's streams for one
// round: every stream's bucket holds burst tokens, and budget milli-units
// per window are divided by demand.
type plan struct {
	burst  int64
	budget int64
	spent  bool // a windowed budget is used up: DENY_ALL
}

// minTokens is the smallest bucket of a stream with demand: Envoy refills
// continuously but admits whole requests, and a bucket of one token that
// is full when the refill passes it loses the refill until the next
// request arrives, so a one-token bucket admits well below its rate.
const minTokens = 2

// planFor sizes the buckets of n streams (n >= 1) on limit sp. Envoy starts
// a token bucket full and refills it continuously, so a stream admits its
// maxTokens plus its rate in one window: the buckets together hold
// headroom × the limit (at least minTokens each) and the rates share the
// rest, so that full buckets across the fleet cannot overshoot the window.
// A token_bucket rule's buckets hold its burst instead. A window longer
// than ttl is a budget: remaining is what the store says is left, and the
// rates let every bucket emptied plus two intervals of refill fit in it.
// docs/rlqs.md ("Bounds") has the details.
func planFor(sp *policy.Spec, n int, headroom float64, remaining int64, windowed bool, interval time.Duration) plan {
	limit := int64(sp.RequestsPerUnit)
	if limit == 0 {
		return plan{spent: true}
	}
	// minTokens each while the buckets take at most half of the limit.
	burst := max(1, int64(headroom*float64(limit))/int64(n), min(minTokens, limit/(2*int64(n))))
	rest := limit - burst*int64(n)
	if rest < limit/2 {
		rest = limit / 2
	}
	if sp.Algorithm == algo.TokenBucket && !windowed {
		// The rule's own bucket admits its capacity at once, then the
		// rate: the streams' buckets share the capacity, their rates the
		// whole rate. (A budget window keeps the headroom plan below:
		// the store's remaining is its tokens now, at most the capacity.)
		capacity := cmp.Or(sp.Burst, limit)
		burst, rest = max(1, capacity/int64(n)), limit
	}
	budget := rest * milli
	if windowed {
		left := remaining - burst*int64(n)
		if left <= 0 {
			return plan{spent: true}
		}
		// Two intervals: usage is reported one interval late. The rates
		// are not spread over the whole window: a budget is there to be
		// used as demand comes, as ShouldRateLimit's fixed window lets
		// it, so a shorter limit of the rule sets the pace while this one
		// has room (combine keeps the smaller rate).
		perWindow := float64(left) * float64(sp.Window) / float64(2*interval)
		budget = int64(math.Min(perWindow*milli, math.MaxInt64/2))
	}
	return plan{burst: burst, budget: budget}
}

// combine keeps the stricter of two shares of one bucket (a rule with
// several limits): a denial, else the smaller rate per second and the
// smaller bucket.
func combine(a, b share, first bool) share {
	if first {
		return b
	}
	if a.deny || b.deny {
		return share{deny: true}
	}
	ra := float64(a.rate) / a.window.Seconds()
	rb := float64(b.rate) / b.window.Seconds()
	out := a
	if rb < ra {
		out.rate, out.window = b.rate, b.window
	}
	out.maxTokens = min(a.maxTokens, b.maxTokens)
	return out
}

// maxFill bounds fill_interval in seconds when a share is below one unit per
// window (one day).
const maxFill = 86400

// tokenBucket turns a share into Envoy's token bucket. Envoy truncates
// fill_interval to whole seconds and refills tokens_per_fill / fill_interval
// per second, so the interval is whole seconds >= 1, and tokens_per_fill is
// rounded down (never above the share); a longer interval keeps at least
// 100 tokens per fill so that rounding costs at most 1 %.
func tokenBucket(s share) *typev3.TokenBucket {
	w := int64(s.window / time.Second)
	if w < 1 {
		w = 1
	}
	var fill int64
	tokens := int64(1)
	switch {
	case s.rate <= 0:
		fill = max(w, maxFill)
	case s.rate < milli:
		// Less than a unit per window: one token every so many windows.
		fill = min(max((milli*w+s.rate-1)/s.rate, 1), max(w, maxFill))
	default:
		k := int64(1)
		for k < 60 && s.rate*k/milli < 100 && w*(k+1) <= max(w, maxFill) {
			k++
		}
		fill, tokens = w*k, s.rate*k/milli
	}
	tokens = min(max(tokens, 1), math.MaxUint32)
	return &typev3.TokenBucket{
		MaxTokens:     uint32(min(max(s.maxTokens, 1), math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(tokens)),
		FillInterval:  durationpb.New(time.Duration(fill) * time.Second),
	}
}

// strategy is the RateLimitStrategy of a share.
func strategy(s share) *typev3.RateLimitStrategy {
	if s.deny {
		return blanket(typev3.RateLimitStrategy_DENY_ALL)
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tokenBucket(s)}}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// wholeSeconds rounds d up to whole seconds, at least 1: Envoy reads only
// the seconds of assignment_time_to_live, and 0 expires at once.
func wholeSeconds(d time.Duration) time.Duration {
	s := (d + time.Second - 1) / time.Second
	return max(s, 1) * time.Second
}
