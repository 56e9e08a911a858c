package memory

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// A full store decides a new key it has no slot for with a sketch: for
// each algorithm and window (sketchKey), Depth rows of Width cells, a
// key's cell in each row chosen by a hash. A cell holds an algo.State that
// is at least the state of every key mapped to it (the largest count of
// the window, the latest TAT), so the smallest of a key's cells, its
// estimate, is never below the key's own state: a decision on it never
// admits what the exact state would deny. A decision is merged back by
// raising each of the key's cells to the new state (the conservative
// update of a count-min sketch). A cell never drops: a release or a reset
// credits nothing, and a window's counts clear only when the window ends.
//
// Every use of one key, exact or sketched, holds the key's shard lock, so
// a key's own merges are ordered; other keys only raise its cells, so its
// cells need not be read or raised together: each cell is read or raised
// alone under one of the sketch's striped locks, taken under shard locks.
//
// Fixed windows, sliding windows and token buckets are sketched. A sliding
// log or concurrency key that needs a slot while none is free is denied
// (refused), as is any key once maxSketches sketches exist.

// Default sketch size: 4 rows of 4096 cells (384 KiB per algorithm and
// window), at most maxSketches of them.
const (
	defaultSketchWidth = 4096
	defaultSketchDepth = 4
	maxSketches        = 64
)

// sketchKey names the window a sketch counts in. Rate and Burst are left
// out, as in the backend key, so that a raised or lowered limit keeps its
// counts; a token bucket's cells hold whole microseconds of TAT, which do
// not depend on the rate.
type sketchKey struct {
	kind     algo.Kind
	period   time.Duration
	calendar algo.Calendar
	mult     int64
}

func keyOfLimit(l algo.Limit) sketchKey {
	return sketchKey{kind: l.Kind, period: l.Period, calendar: l.Calendar, mult: l.Multiplier}
}

// sketchable reports whether keys of kind k can be decided by a sketch.
func sketchable(k algo.Kind) bool {
	return k == algo.FixedWindow || k == algo.SlidingWindow || k == algo.TokenBucket
}

// cell is one sketch counter: State.Time, Count and Prev of a fixed or
// sliding window, or a token bucket's TAT rounded up to a whole µs in time.
type cell struct{ time, count, prev int64 }

// sketchStripes is the number of locks of a sketch's cells: cell i is
// read and written under stripe i % sketchStripes.
const sketchStripes = 64

type sketch struct {
	cells   []cell // depth rows of width cells
	stripes [sketchStripes]struct {
		sync.Mutex
		_ [56]byte // one lock per cache line
	}
}

// at returns cell i, read under its stripe's lock.
func (sk *sketch) at(i int) cell {
	m := &sk.stripes[i%sketchStripes]
	m.Lock()
	c := sk.cells[i]
	m.Unlock()
	return c
}

// raise sets cell i to f(cell i) under its stripe's lock.
func (sk *sketch) raise(i int, f func(cell) cell) {
	m := &sk.stripes[i%sketchStripes]
	m.Lock()
	sk.cells[i] = f(sk.cells[i])
	m.Unlock()
}

// sketches are the sketches of one Store.
type sketches struct {
	hash  func(string) uint64 // of a key, for its cells
	seed  maphash.Seed
	depth int
	width int
	mask  uint64
	mu    sync.Mutex // creating a sketch
	m     atomic.Pointer[map[sketchKey]*sketch]
	// approx counts hits decided by a sketch, refused hits denied for
	// want of a slot and of a sketch.
	approx, refused atomic.Uint64
}

func (ss *sketches) init(width, depth int) {
	if width <= 0 {
		width = defaultSketchWidth
	}
	if depth <= 0 {
		depth = defaultSketchDepth
	}
	width = 1 << bits.Len(uint(width-1)) // a power of 2
	ss.seed, ss.width, ss.depth, ss.mask = maphash.MakeSeed(), width, depth, uint64(width-1)
	ss.hash = func(k string) uint64 { return maphash.String(ss.seed, k) }
}

// get returns the sketch of l's window, or nil when there is none.
func (ss *sketches) get(l algo.Limit) *sketch {
	m := ss.m.Load()
	if m == nil {
		return nil
	}
	return (*m)[keyOfLimit(l)]
}

// make returns the sketch of l's window, creating it; nil when l's kind is
// not sketchable or maxSketches exist.
func (ss *sketches) make(l algo.Limit) *sketch {
	if !sketchable(l.Kind) {
		return nil
	}
	if sk := ss.get(l); sk != nil {
		return sk
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	old := ss.m.Load()
	k := keyOfLimit(l)
	if old != nil {
		if sk := (*old)[k]; sk != nil {
			return sk
		}
		if len(*old) >= maxSketches {
			return nil
		}
	}
	m := make(map[sketchKey]*sketch, 1)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	sk := &sketch{cells: make([]cell, ss.width*ss.depth)}
	m[k] = sk
	ss.m.Store(&m)
	return sk
}

// index returns key's cell in row r: double hashing of one 64-bit hash.
func (ss *sketches) index(h uint64, r int) int {
	h1, h2 := h&0xffffffff, h>>32|1
	return r*ss.width + int((h1+uint64(r)*h2)&ss.mask)
}

// estimate returns a state of key under l at nowUs that is at least its
// own: the smallest of its cells (zero when l's window has no sketch).
func (ss *sketches) estimate(l algo.Limit, key string, nowUs int64) algo.State {
	sk := ss.get(l)
	if sk == nil {
		return algo.State{}
	}
	h := ss.hash(key)
	switch l.Kind {
	case algo.TokenBucket:
		tat := int64(0)
		for r := range ss.depth {
			c := sk.at(ss.index(h, r))
			if r == 0 || c.time < tat {
				tat = c.time
			}
		}
		if tat <= nowUs {
			return algo.State{}
		}
		return algo.State{Time: tat}
	case algo.FixedWindow:
		ws, _ := algo.WindowBoundsUs(l, nowUs)
		n := int64(0)
		for r := range ss.depth {
			c := sk.at(ss.index(h, r))
			v := int64(0)
			if c.time >= ws {
				v = c.count
			}
			if r == 0 || v < n {
				n = v
			}
		}
		if n == 0 {
			return algo.State{}
		}
		return algo.State{Time: ws, Count: n}
	default: // SlidingWindow
		ws, _ := algo.WindowBoundsUs(l, nowUs)
		var cur, prev int64
		for r := range ss.depth {
			c, p := normalise(l, sk.at(ss.index(h, r)), ws)
			if r == 0 || c < cur {
				cur = c
			}
			if r == 0 || p < prev {
				prev = p
			}
		}
		if cur == 0 && prev == 0 {
			return algo.State{}
		}
		return algo.State{Time: ws, Count: cur, Prev: prev}
	}
}

// normalise returns the counts of a sliding-window cell in the window that
// starts at ws and the one before it. A cell of a later window (the clock
// went back) counts whole in the current one.
func normalise(l algo.Limit, c cell, ws int64) (cur, prev int64) {
	switch {
	case c.time >= ws:
		return c.count, c.prev
	case c.time == 0:
		return 0, 0
	}
	if ps, _ := algo.WindowBoundsUs(l, ws-1); c.time >= ps {
		return 0, c.count
	}
	return 0, 0
}

// merge raises key's cells under l to st, its new state.
func (ss *sketches) merge(l algo.Limit, key string, st algo.State) {
	sk := ss.get(l)
	if sk == nil {
		return
	}
	h := ss.hash(key)
	var f func(cell) cell
	switch l.Kind {
	case algo.TokenBucket:
		tat := st.Time
		if st.Count > 0 {
			tat++
		}
		if tat == 0 {
			return
		}
		f = func(c cell) cell { c.time = max(c.time, tat); return c }
	case algo.FixedWindow:
		if st.Count == 0 {
			return
		}
		f = func(c cell) cell {
			if st.Time > c.time {
				return cell{time: st.Time, count: st.Count}
			}
			c.count = max(c.count, st.Count)
			return c
		}
	default: // SlidingWindow
		if st.Count == 0 && st.Prev == 0 {
			return
		}
		f = func(c cell) cell {
			w := max(c.time, st.Time)
			cc, cp := normalise(l, c, w)
			sc, sp := normalise(l, cell{time: st.Time, count: st.Count, prev: st.Prev}, w)
			return cell{time: w, count: max(cc, sc), prev: max(cp, sp)}
		}
	}
	for r := range ss.depth {
		sk.raise(ss.index(h, r), f)
	}
}
