// Package memory is the in-process store of ratelimitd: a sharded table
// from backend key to algo.State, one mutex per shard, that decides every
// hit of a request atomically (the service.Store contract: a denied
// request writes only its kept hits, refunds and always_charge). State is
// per process: replicas do not share counters (use the Redis store for
// that).
//
// A key expires at algo.ExpiresAtUs of its state. Each shard orders its
// keys by expiry in a min-heap, so expired keys are found without visiting
// live ones: when a request touches one, when the store is full, and by
// the background sweep (Options.SweepInterval).
//
// With Options.MaxKeys set, a request that needs a new key on a full store
// drops expired keys, earliest first, but never a live one: evicting a
// counter inside its window, as an LRU cache would, would let a flood of
// unique keys reset other clients' limits. When no key has expired, new
// keys are decided by a sketch that never under-counts (sketch.go), and
// the stored keys keep being decided exactly. The work of a call does not
// grow with the number of stored keys. docs/operations.md ("In-memory
// store") describes the behaviour for operators.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Options configure a Store. The zero value is valid: 64 shards, time.Now,
// a sweep every minute, no key bound.
type Options struct {
	// Shards is the number of independently locked tables (0 means 64).
	// More shards mean less lock contention between unrelated keys; a full
	// store looking for an expired key reads each shard's earliest expiry
	// at most once per request.
	Shards int
	// Now is the clock (nil means time.Now). Tests pin it.
	Now func() time.Time
	// SweepInterval is how often the background sweep drops expired keys
	// (0 means one minute; negative disables the sweep, leaving lazy
	// expiry on access and eviction when full).
	SweepInterval time.Duration
	// MaxKeys bounds the number of stored keys (0 means no bound). A
	// request that needs a new key when MaxKeys keys are stored drops an
	// expired key for it; when none has expired the new key is decided
	// by a sketch that never under-counts, or denied. Live keys are never
	// dropped (see the package documentation).
	MaxKeys int
	// SketchWidth and SketchDepth size the sketches a full store decides
	// new keys with: SketchDepth rows of SketchWidth cells (rounded up to
	// a power of 2) per algorithm and window (0 means 4096 and 4; see the
	// package documentation).
	SketchWidth, SketchDepth int
}

// Validate reports an invalid option.
func (o Options) Validate() error {
	if o.Shards < 0 || o.Shards > 1<<16 {
		return fmt.Errorf("memory: Shards %d outside [0, 65536]", o.Shards)
	}
	if o.MaxKeys < 0 {
		return fmt.Errorf("memory: MaxKeys %d is negative", o.MaxKeys)
	}
	if o.SketchWidth < 0 || o.SketchWidth > 1<<24 {
		return fmt.Errorf("memory: SketchWidth %d outside [0, 16777216]", o.SketchWidth)
	}
	if o.SketchDepth < 0 || o.SketchDepth > 16 {
		return fmt.Errorf("memory: SketchDepth %d outside [0, 16]", o.SketchDepth)
	}
	return nil
}

// Store is the in-memory store. It is safe for concurrent use. Close stops
// the background sweep.
type Store struct {
	shards []shard
	seed   maphash.Seed
	now    func() time.Time
	max    int64
	// keys counts the stored keys plus the slots held by calls in flight
	// (see call.held); with max > 0 it never exceeds max.
	keys atomic.Int64
	// soonest is a lower bound on every shard's top: no stored key expires
	// before it, so a full store refuses a new key with one load while
	// soonest is later than now. lowers counts shard tops moving earlier;
	// a scan that raises soonest keeps its result only if lowers did not
	// change meanwhile (makeRoom, Sweep).
	soonest atomic.Int64
	lowers  atomic.Uint64
	cursor  atomic.Uint32 // first shard of the next makeRoom scan
	// Work counters (tests): keys dropped by eviction or the sweep, and
	// shard tops read by makeRoom.
	evicted atomic.Int64
	scanned atomic.Int64
	// sk decides the new keys a full store has no slot for.
	sk sketches
	// leases holds the subscribers' demand of leased keys; their counters
	// are the shards' entries (see Lease).
	leases leaseTable

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New returns a Store and starts its sweep goroutine (unless disabled).
func New(opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	n := opts.Shards
	if n == 0 {
		n = 64
	}
	s := &Store{
		shards: make([]shard, n),
		seed:   maphash.MakeSeed(),
		now:    opts.Now,
		max:    int64(opts.MaxKeys),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.sk.init(opts.SketchWidth, opts.SketchDepth)
	s.soonest.Store(math.MaxInt64)
	for i := range s.shards {
		s.shards[i].st = s
		s.shards[i].top.Store(math.MaxInt64)
	}
	iv := opts.SweepInterval
	if iv == 0 {
		iv = time.Minute
	}
	if iv < 0 {
		close(s.done)
		return s, nil
	}
	go s.sweepLoop(iv)
	return s, nil
}

// Close stops the background sweep and waits for it. It is idempotent; the
// Store keeps answering Take after Close (without the background sweep).
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Len returns the number of stored keys, including expired ones not
// dropped yet (and, while calls are in flight, slots they hold for keys
// they are about to store).
func (s *Store) Len() int { return int(s.keys.Load()) }

// ref is where one hit's key lives: the low 32 bits of its hash, its
// shard, and its entry when present.
type ref struct {
	h32   uint32
	shard int
	id    uint32
	ok    bool // present and not expired
}

// call is the bookkeeping of one Take.
type call struct {
	refs  []ref
	locks []int // shards to lock, ascending, distinct
	// held counts slots in Store.keys owned by this call with no key in
	// them: of keys it dropped (expired or emptied) or evicted, or
	// reserved. Take gives them back at the end.
	held             int64
	evicted, scanned int64
}

// Take decides all hits of one request atomically, as the Store contract
// in the algo package doc says: the shards of every hit are locked in
// ascending order (so concurrent requests cannot deadlock), hits are
// applied in request order, and a denied request commits only its Kept
// hits and penalty counts. On a full store, new keys take the slots of
// expired ones or are decided by the sketches. It fails only when ctx is
// done before it starts.
func (s *Store) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	if len(hits) == 0 {
		return nil
	}
	now := s.now()
	var refs [4]ref
	var locks [4]int
	c := call{refs: refs[:0], locks: locks[:0]}
	if len(hits) > len(refs) {
		c.refs, c.locks = make([]ref, 0, len(hits)), make([]int, 0, len(hits))
	}
	n := uint64(len(s.shards))
	for _, h := range hits {
		x := maphash.String(s.seed, h.Key)
		r := ref{h32: uint32(x), shard: int((x >> 32) % n)}
		c.refs = append(c.refs, r)
		c.locks = append(c.locks, r.shard)
	}
	slices.Sort(c.locks)
	c.locks = slices.Compact(c.locks)

	short := s.take(&c, hits, now, out, false)
	if short > 0 {
		if got := s.makeRoom(&c, short, now.UnixMicro()); got > 0 {
			c.held += got
			if got >= short {
				short = s.take(&c, hits, now, out, false)
			}
		}
		if short > 0 {
			// no slot: the new keys go to the sketches
			s.take(&c, hits, now, out, true)
		}
	}
	if c.held > 0 {
		s.keys.Add(-c.held)
	}
	if c.evicted > 0 {
		s.evicted.Add(c.evicted)
	}
	if c.scanned > 0 {
		s.scanned.Add(c.scanned)
	}
	return nil
}

// take decides hits with their shards locked and commits them. It returns
// 0 when the request is decided (out is filled), or the number of slots
// still missing for its new keys, having written nothing. With over (the
// store is full), every absent key is decided by its window's sketch and
// merged into it, or refused (see refuse), and takes no slot.
func (s *Store) take(c *call, hits []algo.Hit, now time.Time, out []algo.Decision, over bool) int64 {
	nowUs := now.UnixMicro()
	for _, i := range c.locks {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range c.locks {
			s.shards[i].mu.Unlock()
		}
	}()

	for i := range hits {
		r := &c.refs[i]
		sh := &s.shards[r.shard]
		r.id, r.ok = sh.find(hits[i].Key, r.h32)
		if r.ok && sh.exp(r.id) <= nowUs {
			// expired: it reads as absent, and its slot passes to this call
			sh.remove(r.id)
			r.ok = false
			c.held++
		}
	}
	// stored returns the state of hit i's key before the request: its
	// stored state or, when absent, its sketch's estimate (zero when its
	// window has no sketch), so a key leaving a sketch for a slot keeps
	// its count.
	stored := func(i int) algo.State {
		r := c.refs[i]
		if !r.ok {
			if s.sk.m.Load() == nil {
				return algo.State{}
			}
			return s.sk.estimate(hits[i].Limit, hits[i].Key, nowUs)
		}
		return s.shards[r.shard].state(r.id)
	}
	// refused[i]: hit i's key is absent, the store is full and its kind
	// has no sketch, so a hit that would change its state is denied.
	var refused []bool
	if over {
		refused = make([]bool, len(hits))
		var a, f uint64
		for i, h := range hits {
			switch {
			case c.refs[i].ok:
			case !h.Release && h.Cost > 0 && s.sk.make(h.Limit) == nil:
				refused[i] = true
				f++
			default:
				a++
			}
		}
		s.sk.approx.Add(a)
		s.sk.refused.Add(f)
	}

	type tent struct {
		st    algo.State
		limit algo.Limit
		first int // the first hit with this key
	}
	var pending map[string]tent
	if len(hits) > 1 {
		pending = make(map[string]tent, len(hits))
	}
	var single tent
	var after []algo.State // each penalized hit's state after it
	denied := false
	for i, h := range hits {
		t, ok := pending[h.Key]
		if !ok {
			t = tent{st: stored(i), first: i}
		}
		ns, d := algo.Apply(t.st, h, now)
		if refused != nil && refused[i] {
			ns, d = t.st, s.refuse(h.Limit, nowUs)
		}
		out[i] = d
		if !d.Allowed && !h.Soft {
			denied = true
		}
		if h.Penalty.On() {
			if after == nil {
				after = make([]algo.State, len(hits))
			}
			after[i] = ns
		}
		t.st, t.limit = ns, h.Limit
		if pending != nil {
			pending[h.Key] = t
		} else {
			single = t
		}
	}
	if denied {
		// Replay on the stored states with only the Kept hits (releases,
		// always_charge): they are committed; the other hits that did not
		// deny report a check at their place (algotest.Reference).
		var kept map[string]tent
		for i, h := range hits {
			t, ok := kept[h.Key]
			if !ok {
				t = tent{st: stored(i), first: i}
			}
			switch {
			case refused != nil && refused[i]:
			case h.Kept():
				t.st, out[i] = algo.Apply(t.st, h, now)
				t.limit = h.Limit
				if kept == nil {
					kept = make(map[string]tent, len(hits))
				}
				kept[h.Key] = t
			case !out[i].Allowed && h.Penalized():
				// the denial count and block of a penalized hit are kept
				// (a Soft hit's box is only what earlier hits left)
				t.st = algo.KeepPenalty(t.st, after[i])
				t.limit = h.Limit
				if kept == nil {
					kept = make(map[string]tent, len(hits))
				}
				kept[h.Key] = t
			case out[i].Allowed:
				_, out[i] = algo.Take(h.Limit, t.st, now, 0)
			}
		}
		if kept == nil {
			return 0
		}
		pending = kept
	}

	isNew := func(t tent) bool {
		return !over && !c.refs[t.first].ok && algo.ExpiresAtUs(t.limit, t.st) > nowUs
	}
	added := int64(0)
	if pending == nil {
		if isNew(single) {
			added = 1
		}
	} else {
		for _, t := range pending {
			if isNew(t) {
				added++
			}
		}
	}
	if added > 0 {
		if short := s.room(c, added, nowUs); short > 0 {
			return short
		}
	}
	commit := func(key string, t tent) {
		r := c.refs[t.first]
		if over && !r.ok {
			s.sk.merge(t.limit, key, t.st) // no-op without a sketch
			return
		}
		sh := &s.shards[r.shard]
		exp := algo.ExpiresAtUs(t.limit, t.st)
		switch {
		case exp == 0 || exp <= nowUs:
			if r.ok {
				sh.remove(r.id)
				c.held++
			}
		case r.ok:
			sh.update(r.id, t.st, exp)
		default:
			sh.insert(key, r.h32, t.st, exp)
		}
	}
	if pending == nil {
		commit(hits[0].Key, single)
	} else {
		for k, t := range pending {
			commit(k, t)
		}
	}
	return 0
}

// refuse is the decision of a hit refused for want of a slot and of a
// sketch: denied until the earliest stored key expires (at least 1 ms;
// the limit's period when nothing is stored).
func (s *Store) refuse(l algo.Limit, nowUs int64) algo.Decision {
	e := int64(math.MaxInt64)
	for i := range s.shards {
		e = min(e, s.shards[i].top.Load())
	}
	d := l.Period
	if e != math.MaxInt64 {
		d = algo.MicrosDuration(e - nowUs)
	}
	d = max(d, time.Millisecond)
	return algo.Decision{RetryAfter: d, ResetAfter: d, WindowAfter: d}
}

// Approximated returns, since New, the hits of keys a full store had no
// slot for that it decided with a sketch, and those it denied for want of
// a slot and of a sketch (sliding log and concurrency keys). A request
// that needs no new slot (one denied, or a check) is not counted; a lease
// of a new key counts as one hit.
func (s *Store) Approximated() (sketched, refused uint64) {
	return s.sk.approx.Load(), s.sk.refused.Load()
}

// Reset deletes the state of every hit's Key (service.Resetter): the next
// Take on it starts from a full quota, or from its sketch's estimate when
// a full store counted keys of its window in a sketch (cells are shared,
// so a reset cannot lower them). Absent keys are skipped; it fails only
// when ctx is done before it starts.
func (s *Store) Reset(ctx context.Context, hits []algo.Hit) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	n := uint64(len(s.shards))
	for _, h := range hits {
		x := maphash.String(s.seed, h.Key)
		sh := &s.shards[int((x>>32)%n)]
		sh.mu.Lock()
		id, ok := sh.find(h.Key, uint32(x))
		if ok {
			sh.remove(id)
		}
		sh.mu.Unlock()
		if ok {
			s.keys.Add(-1)
		}
	}
	return nil
}
