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
