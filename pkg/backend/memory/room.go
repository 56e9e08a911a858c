package memory

import (
	"math"
	"time"
)

// sweepChunk is the most keys the sweep drops per shard lock hold.
const sweepChunk = 256

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

// Sweep drops every expired key now, visiting only those (earliest expiry
// first, at most sweepChunk per shard lock hold). The background goroutine
// calls it every SweepInterval; it is exported for tests and operators.
func (s *Store) Sweep() { s.sweep(s.now().UnixMicro()) }

func (s *Store) sweep(nowUs int64) {
	g0 := s.lowers.Load()
	m := int64(math.MaxInt64)
	for i := range s.shards {
		sh := &s.shards[i]
		for {
			sh.mu.Lock()
			k := int64(0)
			for k < sweepChunk && sh.expired(nowUs) {
				sh.evictTop()
				k++
			}
			more, t := sh.expired(nowUs), sh.top.Load()
			sh.mu.Unlock()
			s.keys.Add(-k)
			s.evicted.Add(k)
			if !more {
				m = min(m, t)
				break
			}
		}
	}
	s.raise(g0, m)
}

// lowered records that a shard's top moved earlier, to t.
func (s *Store) lowered(t int64) {
	s.lowers.Add(1)
	for {
		g := s.soonest.Load()
		if g <= t || s.soonest.CompareAndSwap(g, t) {
			return
		}
	}
}

// raise sets soonest to m, the least shard top read after lowers was g0,
// unless a top moved earlier since (then soonest proves nothing until the
// next full scan).
func (s *Store) raise(g0 uint64, m int64) {
	s.soonest.Store(m)
	if s.lowers.Load() != g0 {
		s.soonest.Store(math.MinInt64)
	}
}

// reserve takes up to n slots under max for new keys and returns how many.
func (s *Store) reserve(n int64) int64 {
	if s.max == 0 {
		s.keys.Add(n)
		return n
	}
	for {
		k := s.keys.Load()
		r := min(n, s.max-k)
		if r <= 0 {
			return 0
		}
		if s.keys.CompareAndSwap(k, k+r) {
			return r
		}
	}
}

// makeRoom drops up to need expired keys, taking one shard lock at a time
// (the caller holds none), and returns how many; their slots stay counted
// in keys and pass to the caller.
func (s *Store) makeRoom(c *call, need, nowUs int64) int64 {
	if s.soonest.Load() > nowUs {
		return 0 // nothing has expired
	}
	g0 := s.lowers.Load()
	n := len(s.shards)
	start := int(s.cursor.Add(1) % uint32(n))
	m := int64(math.MaxInt64)
	got := int64(0)
	for j := range n {
		sh := &s.shards[(start+j)%n]
		c.scanned++
		t := sh.top.Load()
		if t <= nowUs {
			sh.mu.Lock()
			for got < need && sh.expired(nowUs) {
				sh.evictTop()
				got++
			}
			t = sh.top.Load()
			sh.mu.Unlock()
			if got == need {
				c.evicted += got
				return got
			}
		}
		m = min(m, t)
	}
	c.evicted += got
	s.raise(g0, m)
	return got
}

// room finds slots for added new keys (shards locked): slots the call
// holds, free slots under MaxKeys, then expired keys of the locked shards.
// It returns 0 when the call has them (now committed to the new keys), or
// how many are missing (the call then holds the ones it found).
func (s *Store) room(c *call, added, nowUs int64) int64 {
	have := min(added, c.held)
	c.held -= have
	have += s.reserve(added - have)
	for _, i := range c.locks {
		sh := &s.shards[i]
		for have < added && sh.expired(nowUs) {
			sh.evictTop()
			have++
			c.evicted++
		}
	}
	if have == added {
		return 0
	}
	c.held += have
	return added - have
}
