package rlqs

import (
	"context"
	"sync"
	"time"
)

// Demand shares each stream's demand on a counter among the replicas of
// ratelimitd, so that every replica divides a limit among all the fleet's
// streams, and divides it by the same numbers. The Redis store implements
// it (redis.Store.ShareDemand); Memory is the one-process form.
type Demand interface {
	// ShareDemand records, per counter key of local, this replica's
	// streams' demand for round (stream id -> demand) and returns per key
	// the fleet's demand as every replica sees it in that round: per stream
	// its value of the previous round, else of the one before, else of this
	// round (a stream that just joined). The entries of a round expire
	// after ttl. One atomic step per key.
	ShareDemand(ctx context.Context, round int64, ttl time.Duration, local map[string]map[string]int64) (map[string]map[string]int64, error)
}

// Memory is Demand within one process (the memory backend, and replicas
// in one test process).
type Memory struct {
	mu     sync.Mutex
	rounds map[string]map[int64]map[string]int64 // key -> round -> stream -> demand
}

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{rounds: map[string]map[int64]map[string]int64{}} }

// ShareDemand implements Demand. Rounds older than two before round are
// dropped; ttl is not needed within one process.
func (m *Memory) ShareDemand(_ context.Context, round int64, _ time.Duration, local map[string]map[string]int64) (map[string]map[string]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]map[string]int64, len(local))
	for key, l := range local {
		byRound := m.rounds[key]
		if byRound == nil {
			byRound = map[int64]map[string]int64{}
			m.rounds[key] = byRound
		}
		cur := byRound[round]
		if cur == nil {
			cur = map[string]int64{}
			byRound[round] = cur
		}
		for id, d := range l {
			cur[id] = d
		}
		for r := range byRound {
			if r < round-2 {
				delete(byRound, r)
			}
		}
		out[key] = mergeRounds(cur, byRound[round-2], byRound[round-1])
	}
	return out, nil
}

// mergeRounds is the fleet's view from the demand of three rounds, the
// later arguments first: per stream the previous round's value, else the
// one before, else this round's.
func mergeRounds(rounds ...map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, r := range rounds {
		for id, d := range r {
			out[id] = d
		}
	}
	return out
}
