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
// (see Store.takeCluster). Keys share a fixed table by hash; each entry
// holds a fingerprint and the instant until which its key is a likely
// denier, so a colliding key reads as unknown. A wrong hint only changes
// which group goes first (see docs/redis.md for the few decisions a
// compensating refund cannot restore). Safe for concurrent use.
type leadHints struct {
	seed    maphash.Seed
	baseMs  int64                       // unix ms of the Store's clock at newLeadHints
	entries [leadHintSlots]atomic.Int64 // fingerprint<<untilBits | until (ms, see ms)
}

// untilBits hold an entry's instant (ms, ±34 years around baseMs); the
// fingerprint takes the 22 bits above. baseMs comes from the clock the
// hints are read with (the Store's, pinned by Options.Now in tests), so
// a clock far from the wall clock still fits the range.
const (
	untilBits = 41
	untilMask = 1<<untilBits - 1
)

// newLeadHints returns empty hints read by a clock that reads now.
func newLeadHints(now time.Time) *leadHints {
	return &leadHints{seed: maphash.MakeSeed(), baseMs: now.UnixMilli()}
}

// ms is t in an entry's units: ms from 2^40 ms before baseMs, within
// [0, untilMask].
func (h *leadHints) ms(t time.Time) int64 {
	return min(max(t.UnixMilli()-h.baseMs+1<<40, 0), untilMask)
}

// entry is key's table entry and fingerprint.
func (h *leadHints) entry(key string) (*atomic.Int64, int64) {
	x := maphash.String(h.seed, key)
	return &h.entries[x%leadHintSlots], int64(x >> (64 - (63 - untilBits)))
}

// hot reports whether key denied lately (until after now).
func (h *leadHints) hot(key string, now time.Time) bool {
	e, fp := h.entry(key)
	v := e.Load()
	return v>>untilBits == fp && v&untilMask > h.ms(now)
}

// note records the denied hits of decisions (hits[i] got out[i]) at now.
func (h *leadHints) note(hits []algo.Hit, out []algo.Decision, now time.Time) {
	for i, d := range out {
		if d.Allowed || hits[i].Soft {
			continue
		}
		until := h.ms(now.Add(max(d.RetryAfter, leadHintMin)))
		e, fp := h.entry(hits[i].Key)
		if v := e.Load(); v>>untilBits != fp || v&untilMask < until {
			e.Store(fp<<untilBits | until)
		}
	}
}

// leadScore ranks a slot group (its hits) as the first one of its
// request: the lowest leads. A group with a hit that can never be
// admitted (cost above its limit's capacity: a rate of 0 denies
// everything) comes first, whatever the hints say, since it denies for
// sure and then no group is taken and compensated; then a group with a
// key that denied lately (note); then the group whose tightest hit fits
// the fewest times in its limit's capacity (capacity / cost: a
// per-client limit before a shared one). Soft hits and releases never
// deny a request and do not count; a group of only those comes last.
func (h *leadHints) leadScore(hits []algo.Hit, now time.Time) int64 {
	best := int64(math.MaxInt64)
	for _, x := range hits {
		if x.Soft || x.Release {
			continue
		}
		c := capacity(x.Limit) / max(x.Cost, 1)
		if c == 0 {
			return math.MinInt64
		}
		if h.hot(x.Key, now) {
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
