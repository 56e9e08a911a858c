// Package fairshare divides what remains of a limit among the subscribers
// that draw on it: ratelimitd instances holding leases, Envoy streams over
// RLQS, or cells. It is pure (no I/O, time is an argument), so every
// subscriber fed the same inputs computes the same division.
//
// Allocate smooths each subscriber's demand (a rise counts at once, a fall
// halves the gap each round, so a short lull does not take a busy
// subscriber's share away) and divides the remainder max-min fairly by
// smoothed demand. A newcomer gets Options.Floor first, so it can start
// before it has demand to report. Under steady demand the division is
// exactly max-min fair after at most floor(log2(gap))+1 rounds.
package fairshare

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// Options configure an Allocator.
type Options struct {
	// Floor is the allowance a subscriber with no demand history gets, when
	// the remainder allows (remainder >= Floor times the number of such
	// subscribers; else they split the remainder evenly). Zero means no
	// floor.
	Floor int64
}

// Allocator keeps each subscriber's smoothed demand between rounds. It is
// safe for concurrent use.
type Allocator struct {
	opt  Options
	mu   sync.Mutex
	subs map[string]*sub
}

type sub struct {
	smoothed int64     // demand the division uses
	seen     time.Time // now of the last Allocate that listed it
}

// New returns an Allocator with no subscribers.
func New(opt Options) *Allocator {
	if opt.Floor < 0 {
		opt.Floor = 0
	}
	return &Allocator{opt: opt, subs: map[string]*sub{}}
}

// Allocate returns each subscriber's allowance for the next interval: max-min
// fair by demand, a floor for new subscribers, sum never above remaining
// (remaining = limit - used of the window, clamped at 0). demand is each
// subscriber's demand observed over its last interval (units); negative
// demand counts as 0. Only the subscribers in demand get an allowance;
// the others keep their history until Forget.
func (a *Allocator) Allocate(now time.Time, remaining int64, demand map[string]int64) map[string]int64 {
	remaining = max(remaining, 0)
	out := make(map[string]int64, len(demand))
	if len(demand) == 0 {
		return out
	}
	ids := make([]string, 0, len(demand))
	for id := range demand {
		ids = append(ids, id)
	}
	slices.Sort(ids)

	a.mu.Lock()
	var fresh []string
	want := make(map[string]int64, len(ids)) // demand left after the floors
	for _, id := range ids {
		d := max(demand[id], 0)
		s, ok := a.subs[id]
		if !ok {
			a.subs[id] = &sub{smoothed: d, seen: now}
			fresh = append(fresh, id)
			want[id] = max(d, a.opt.Floor)
			continue
		}
		s.smoothed = smooth(s.smoothed, d)
		s.seen = now
		want[id] = s.smoothed
	}
	a.mu.Unlock()

	// Floors first: a newcomer has no demand to compete with yet.
	if n := int64(len(fresh)); n > 0 && a.opt.Floor > 0 {
		each := a.opt.Floor
		if remaining < each*n || each*n/n != each {
			each = remaining / n
		}
		for _, id := range fresh {
			g := min(each, want[id])
			out[id] = g
			want[id] -= g
			remaining -= g
		}
	}

	// Max-min fair water-filling over what is left, in (demand, id) order
	// so that the division is deterministic.
	slices.SortFunc(ids, func(x, y string) int {
		if want[x] != want[y] {
			if want[x] < want[y] {
				return -1
			}
			return 1
		}
		return strings.Compare(x, y)
	})
	for i, id := range ids {
		left := int64(len(ids) - i)
		share := remaining / left
		if want[id] <= share {
			out[id] += want[id]
			remaining -= want[id]
			continue
		}
		// Every subscriber from here on wants more than an even share:
		// each gets the share, and the units that do not divide evenly go
		// one each to the first in id order.
		rest := ids[i:]
		extra := remaining % left
		byID := slices.Clone(rest)
		slices.Sort(byID)
		for j, r := range byID {
			g := share
			if int64(j) < extra {
				g++
			}
			out[r] += g
		}
		break
	}
	return out
}

// smooth returns the next smoothed demand: a rise counts at once, a fall
// halves the gap (rounding towards the new demand).
func smooth(prev, d int64) int64 {
	if d >= prev {
		return d
	}
	gap := prev - d
	return d + gap/2
}

// Forget drops a subscriber's history: its next Allocate treats it as new.
func (a *Allocator) Forget(id string) {
	a.mu.Lock()
	delete(a.subs, id)
	a.mu.Unlock()
}
