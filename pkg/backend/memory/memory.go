// Package memory is the in-process store of ratelimitd: a sharded map from
// backend key to algo.State, one mutex per shard, that decides every hit of
// a request atomically and all-or-nothing (the service.Store contract).
// Idle keys expire: lazily when touched, and by a background sweep, so the
// map does not grow without bound with unique keys. State is per process:
// replicas do not share counters (use the Redis store for that).
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Options configure a Store. The zero value is valid: 64 shards, time.Now,
// a sweep every minute, no key bound.
type Options struct {
	// Shards is the number of independently locked maps (0 means 64).
	// More shards mean less lock contention between unrelated keys.
	Shards int
	// Now is the clock (nil means time.Now). Tests pin it.
	Now func() time.Time
	// SweepInterval is how often the background sweep drops expired keys
	// (0 means one minute; negative disables the sweep, leaving only lazy
	// expiry on access).
	SweepInterval time.Duration
	// MaxKeys bounds the number of stored keys (0 means no bound). A
	// request that would create a key beyond it fails with ErrFull, so the
	// service applies the rule's failure mode, as with a Redis at maxmemory.
	MaxKeys int
}

// Validate reports an invalid option.
func (o Options) Validate() error {
	if o.Shards < 0 || o.Shards > 1<<16 {
		return fmt.Errorf("memory: Shards %d outside [0, 65536]", o.Shards)
	}
	if o.MaxKeys < 0 {
		return fmt.Errorf("memory: MaxKeys %d is negative", o.MaxKeys)
	}
	return nil
}

// ErrFull is returned (wrapped) by Take when MaxKeys keys are stored and the
// request needs a new one. Its Cause is "oom".
var ErrFull error = fullError{}

type fullError struct{}

func (fullError) Error() string { return "memory: store is full (MaxKeys reached)" }

// Cause implements service.Causer.
func (fullError) Cause() string { return "oom" }

type entry struct {
	st  algo.State
	exp int64 // µs since the epoch from which st is empty (algo.ExpiresAtUs)
}

type shard struct {
	mu sync.Mutex
	m  map[string]entry
}

// Store is the in-memory store. It is safe for concurrent use. Close stops
// the background sweep.
type Store struct {
	shards []shard
	seed   maphash.Seed
	now    func() time.Time
	max    int64
	keys   atomic.Int64

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
	for i := range s.shards {
		s.shards[i].m = make(map[string]entry)
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
// Store keeps answering Take after Close (with lazy expiry only).
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Len returns the number of stored keys (including expired ones the sweep
// has not dropped yet).
func (s *Store) Len() int { return int(s.keys.Load()) }

func (s *Store) sweepLoop(iv time.Duration) {
	defer close(s.done)
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Sweep drops every expired key now. The background goroutine calls it
// every SweepInterval; it is exported for tests and operators.
func (s *Store) Sweep() { s.sweep(s.now().UnixMicro()) }

func (s *Store) sweep(now int64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.exp <= now {
				delete(sh.m, k)
				s.keys.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

func (s *Store) shardOf(key string) int {
	return int(maphash.String(s.seed, key) % uint64(len(s.shards)))
}

// Take decides all hits of one request atomically (service.Store): the
// shards of every hit are locked in ascending order, hits are applied in
// request order (a repeated key sees the earlier hit's tentative state),
// and the new states are committed only if no hit was denied, except
// Soft hits (shadow, quota), whose denial writes nothing for that hit but
// does not roll the request back. Otherwise nothing is written and every hit that did not deny
// reports a check (cost 0) on the state before the request.
func (s *Store) Take(ctx context.Context, hits []algo.Hit) ([]algo.Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	out := make([]algo.Decision, len(hits))
	if len(hits) == 0 {
		return out, nil
	}
	now := s.now()
	res, err := s.take(hits, now, out)
	if errors.Is(err, ErrFull) {
		// Expired keys the sweep has not dropped yet make room.
		s.sweep(now.UnixMicro())
		res, err = s.take(hits, now, out)
	}
	return res, err
}

func (s *Store) take(hits []algo.Hit, now time.Time, out []algo.Decision) ([]algo.Decision, error) {
	nowUs := now.UnixMicro()
	idx := make([]int, len(hits))
	for i, h := range hits {
		idx[i] = s.shardOf(h.Key)
	}
	locks := slices.Clone(idx)
	slices.Sort(locks)
	locks = slices.Compact(locks)
	for _, i := range locks {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range locks {
			s.shards[i].mu.Unlock()
		}
	}()

	// stored returns the state of key before the request (zero if absent
	// or expired) and whether the key is present in the map.
	stored := func(i int) (algo.State, bool) {
		e, ok := s.shards[idx[i]].m[hits[i].Key]
		if !ok || e.exp <= nowUs {
			return algo.State{}, ok
		}
		return e.st, true
	}

	type tent struct {
		st    algo.State
		limit algo.Limit
		shard int
	}
	var pending map[string]tent
	if len(hits) > 1 {
		pending = make(map[string]tent, len(hits))
	}
	var single tent
	denied := false
	for i, h := range hits {
		var st algo.State
		if t, ok := pending[h.Key]; ok {
			st = t.st
		} else {
			st, _ = stored(i)
		}
		ns, d := algo.Apply(st, h, now)
		out[i] = d
		if !d.Allowed && !h.Soft {
			denied = true
		}
		if pending != nil {
			pending[h.Key] = tent{st: ns, limit: h.Limit, shard: idx[i]}
		} else {
			single = tent{st: ns, limit: h.Limit, shard: idx[i]}
		}
	}
	if denied {
		for i, h := range hits {
			if out[i].Allowed {
				st, _ := stored(i)
				_, out[i] = algo.Take(h.Limit, st, now, 0)
			}
		}
		return out, nil
	}
	if pending == nil { // one hit: no map
		k := hits[0].Key
		if _, ok := s.shards[single.shard].m[k]; !ok && s.max > 0 && s.keys.Load() >= s.max &&
			algo.ExpiresAtUs(single.limit, single.st) > nowUs {
			return nil, fmt.Errorf("memory: take: %w", ErrFull)
		}
		s.commit(k, single.shard, single.st, single.limit, nowUs)
		return out, nil
	}
	if s.max > 0 {
		added := int64(0)
		for k, t := range pending {
			if _, ok := s.shards[t.shard].m[k]; !ok && algo.ExpiresAtUs(t.limit, t.st) > nowUs {
				added++
			}
		}
		if added > 0 && s.keys.Load()+added > s.max {
			return nil, fmt.Errorf("memory: take: %w", ErrFull)
		}
	}
	for k, t := range pending {
		s.commit(k, t.shard, t.st, t.limit, nowUs)
	}
	return out, nil
}

// commit stores st under key (shard locked), or deletes the key when st is
// empty.
func (s *Store) commit(key string, si int, st algo.State, l algo.Limit, nowUs int64) {
	m := s.shards[si].m
	exp := algo.ExpiresAtUs(l, st)
	_, present := m[key]
	if exp == 0 || exp <= nowUs {
		if present {
			delete(m, key)
			s.keys.Add(-1)
		}
		return
	}
	if !present {
		s.keys.Add(1)
	}
	m[key] = entry{st: st, exp: exp}
}
