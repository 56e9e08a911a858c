package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Local is an in-process Limiter: a token bucket (GCRA, from pkg/algo) of
// rate units per period with a burst capacity, both lowered by a margin.
// It models "burst then throttle" limits; for a fixed-window upstream, use
// a small burst. It is safe for concurrent use.
type Local struct {
	mu    sync.Mutex
	burst int64 // the configured burst, before margin; a resync never exceeds it
	limit algo.Limit
	state algo.State
}

// ErrCostOverBurst is returned by Local.Take (and so by Pacer.Wait) for a
// cost larger than the bucket's capacity, which would never be admitted.
var ErrCostOverBurst = errors.New("client: cost exceeds the bucket's capacity")

// NewLocal returns a token bucket that admits rate units per period with
// the given burst (0 means rate), each scaled by 1-margin (rounded down,
// at least 1), so that the caller stays that far under the upstream's
// published limit. It panics unless rate >= 1, period > 0, burst >= 0 and
// 0 <= margin < 1: a limiter that admits everything or nothing is a bug.
func NewLocal(rate int64, period time.Duration, burst int64, margin float64) *Local {
	if rate < 1 || period <= 0 || burst < 0 || !(margin >= 0 && margin < 1) {
		panic(fmt.Sprintf("client: NewLocal(%d, %v, %d, %v): want rate >= 1, period > 0, burst >= 0, 0 <= margin < 1", rate, period, burst, margin))
	}
	if burst == 0 {
		burst = rate
	}
	l := &Local{burst: burst}
	l.set(rate, period, burst, margin)
	return l
}

func (l *Local) set(rate int64, period time.Duration, burst int64, margin float64) {
	margin = min(max(margin, 0), 0.9)
	scale := func(n int64) int64 { return max(int64(math.Floor(float64(n)*(1-margin))), 1) }
	l.limit = algo.Limit{Kind: algo.TokenBucket, Rate: scale(rate), Period: max(period, time.Microsecond), Burst: scale(max(burst, 1))}
}

// Take implements Limiter. A cost above the bucket's capacity is refused
// with ErrCostOverBurst rather than waited for forever.
func (l *Local) Take(_ context.Context, now time.Time, cost int64) (bool, time.Duration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cost > l.limit.Burst {
		return false, 0, fmt.Errorf("%w: cost %d, capacity %d", ErrCostOverBurst, cost, l.limit.Burst)
	}
	st, d := algo.Take(l.limit, l.state, now, algo.ClampCost(cost))
	l.state = st
	return d.Allowed, d.RetryAfter, nil
}

// Resync implements Resyncer: the bucket follows an advertised quota of q
// per w with a burst of the configured burst or q, whichever is lower,
// both less margin. A changed bucket starts empty (or as far in debt as
// the old one was), so that a resync never releases a burst the old bucket
// had already spent; the same quota seen again changes nothing.
func (l *Local) Resync(q int64, w time.Duration, margin float64) {
	if q <= 0 || w <= 0 {
		return // an exhausted quota is the RateLimit remaining's job
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := l.limit
	l.set(q, w, min(l.burst, q), margin)
	if l.limit == prev {
		return
	}
	// Start empty, or later still if the old bucket was further in debt
	// (its TAT, rounded up to the µs, capped at one more capacity), so that
	// calls already sent at the old rate count against the new one.
	empty, _ := algo.Charge(l.limit, algo.State{}, time.Now(), l.limit.Burst)
	tat := l.state.Time
	if l.state.Count > 0 {
		tat++
	}
	capacity := int64(float64(l.limit.Period.Microseconds()) * float64(l.limit.Burst) / float64(l.limit.Rate))
	if tat > empty.Time {
		l.state = algo.State{Time: min(tat, empty.Time+capacity)}
	} else {
		l.state = empty
	}
}

// Limit returns the bucket's current limit (after margin and resyncs).
func (l *Local) Limit() algo.Limit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}
