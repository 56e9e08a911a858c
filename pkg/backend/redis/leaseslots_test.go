package redis_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestLeaseCallsTakeHalfThePool: 32 concurrent Lease calls on a store of
// PoolSize 4, while Redis holds every write (CLIENT PAUSE WRITE), have
// 2 connections waiting on Redis, half the pool, never more: the others
// wait for a turn within their ctx, and all of them are answered once
// Redis resumes.
func TestLeaseCallsTakeHalfThePool(t *testing.T) {
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.PoolSize = 4
	o.MaxWait = 10 * time.Second
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	admin := srv.Client()
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000000, Period: time.Hour}
	if _, err := s.Lease(ctx, algo.LeaseRequest{Key: "warm", Limit: l, Subscriber: 1, Want: 1}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "PAUSE", 2000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	const calls = 32
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := s.Lease(cctx, algo.LeaseRequest{Key: "k", Limit: l, Subscriber: int64(i + 1), Want: 1})
			errs <- err
		}()
	}
	// Redis holds the calls sent; the connections they wait on are the
	// ones CLIENT LIST shows on a script.
	deadline := time.Now().Add(time.Second)
	top := 0
	for time.Now().Before(deadline) {
		v, err := admin.Do(ctx, "CLIENT", "LIST").Text()
		if err != nil {
			t.Fatal(err)
		}
		top = max(top, strings.Count(v, "cmd=evalsha"))
		time.Sleep(10 * time.Millisecond)
	}
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("lease: %v", err)
		}
	}
	if top != o.PoolSize/2 {
		t.Errorf("%d connections on a lease script at once, want %d (half the pool)", top, o.PoolSize/2)
	}
}
