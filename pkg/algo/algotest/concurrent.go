package algotest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// ConcurrentAllowed sends n one-hit requests (cost 1 on key under l) at
// once, each from its own goroutine released together, request i to
// stores[i mod len(stores)], and returns how many were allowed, with every
// Take error joined. An exact store allows min(n, what l admits) whatever
// the interleaving.
func ConcurrentAllowed[S Store](ctx context.Context, stores []S, key string, l algo.Limit, n int) (int64, error) {
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		s := stores[i%len(stores)]
		wg.Go(func() {
			<-start
			d, err := Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
			if err != nil {
				errs[i] = err
				return
			}
			if d[0].Allowed {
				allowed.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	return allowed.Load(), errors.Join(errs...)
}

// Outcomes counts the decisions of a concurrent run by what decided them.
type Outcomes struct {
	// Allowed, Denied (by the limit, no block started), Started (the
	// denial that started a penalty block) and Blocked (denied by a
	// block in force).
	Allowed, Denied, Started, Blocked int64
}

// ConcurrentOutcomes is ConcurrentAllowed for hit h (its Key, Limit,
// Cost and Penalty): n requests at once, request i to stores[i mod
// len(stores)], counted by outcome. A store that decides a penalty box
// atomically with its limit gives, for a limit admitting L of n at the
// same instant and a box of After denials, exactly L allowed, After-1
// denied, 1 started and the rest blocked, whatever the interleaving.
func ConcurrentOutcomes[S Store](ctx context.Context, stores []S, h algo.Hit, n int) (Outcomes, error) {
	var c [4]atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		s := stores[i%len(stores)]
		wg.Go(func() {
			<-start
			d, err := Take(ctx, s, []algo.Hit{h})
			if err != nil {
				errs[i] = err
				return
			}
			switch {
			case d[0].Allowed:
				c[0].Add(1)
			case d[0].Penalty == algo.PenaltyStarted:
				c[2].Add(1)
			case d[0].Penalty == algo.PenaltyBlocked:
				c[3].Add(1)
			default:
				c[1].Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	return Outcomes{Allowed: c[0].Load(), Denied: c[1].Load(), Started: c[2].Load(), Blocked: c[3].Load()}, errors.Join(errs...)
}
