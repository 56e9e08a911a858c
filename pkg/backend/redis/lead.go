package redis

import (
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// leadHintSlots is the size of leadHints' table (8 bytes each).
const leadHintSlots = 4096

// leadHintMin is the least time a denial marks its key as a likely
// denier: a key that denied tends to deny again soon after its
// RetryAfter (a token bucket at its rate denies between its tokens).
const leadHintMin = time.Second

// leadHints remember which keys denied lately, so that a Cluster request
// spanning slots is first decided in the slot group most likely to deny
// (see Store.takeCluster): when that group denies, the others consume
// nothing. Keys share a fixed table by hash: a collision can only change
// which group goes first, never a decision. Safe for concurrent use.
type leadHints struct {
	seed  maphash.Seed
	until [leadHintSlots]atomic.Int64 // unix ns until which the key is a likely denier
}

func newLeadHints() *leadHints { return &leadHints{seed: maphash.MakeSeed()} }

func (h *leadHints) slot(key string) *atomic.Int64 {
	return &h.until[maphash.String(h.seed, key)%leadHintSlots]
}

// note records the denied hits of decisions (hits[i] got out[i]) at now.
func (h *leadHints) note(hits []algo.Hit, out []algo.Decision, now time.Time) {
	for i, d := range out {
		if d.Allowed || hits[i].Soft {
			continue
		}
		until := now.Add(max(d.RetryAfter, leadHintMin)).UnixNano()
		if sl := h.slot(hits[i].Key); sl.Load() < until {
			sl.Store(until)
		}
	}
}

// leadScore ranks a slot group (its hits) as the first one of its
// request: the lowest leads. A group with a key that denied lately
// (note) comes before any other; then the group whose tightest hit fits
// the fewest times in its limit's capacity (capacity / cost: a per-client
// limit before a shared one). Soft hits and releases never deny a
// request and do not count; a group of only those comes last.
func (h *leadHints) leadScore(hits []algo.Hit, now time.Time) int64 {
	best := int64(math.MaxInt64)
	ns := now.UnixNano()
	for _, x := range hits {
		if x.Soft || x.Release {
			continue
		}
		c := capacity(x.Limit) / max(x.Cost, 1)
		if h.slot(x.Key).Load() > ns {
			c -= 1 << 62 // capacities are below 2^53
		}
		best = min(best, c)
	}
	return best
}

// capacity is how many units l admits from an empty state: Burst (Rate
// when 0) for a token bucket, Rate otherwise; 0 when Rate is not
// positive (denies everything).
func capacity(l algo.Limit) int64 {
	if l.Rate <= 0 {
		return 0
	}
	if l.Kind == algo.TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}
