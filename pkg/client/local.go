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
	l := &Local{}
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
// per w, less margin, with a burst no larger than q. A changed bucket
// starts empty, so that a resync never releases a burst the old bucket
// had already spent.
func (l *Local) Resync(q int64, w time.Duration, margin float64) {
	if q <= 0 || w <= 0 {
		return // an exhausted quota is the RateLimit remaining's job
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := l.limit
	l.set(q, w, min(prev.Burst, q), margin)
	if l.limit != prev {
		l.state, _ = algo.Charge(l.limit, algo.State{}, time.Now(), l.limit.Burst)
	}
}

// Limit returns the bucket's current limit (after margin and resyncs).
func (l *Local) Limit() algo.Limit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}
