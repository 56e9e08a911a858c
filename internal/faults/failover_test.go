package faults

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestSentinelFailoverCounts: 8 callers (no deadline) on 4 keys of the big
// rule, over 2 instances with their default flags in Sentinel mode, while
// `SENTINEL FAILOVER` promotes the replica; the load goes on for 2 s after
// the new master answers as one. Then, per key, the store's count (read
// with a check-only call) must equal the OK answers: a hit admitted but not
// counted (failed open, or written to the old master and lost when it
// became a replica) lets more through than the limit; a hit counted twice
// denies too early.
func TestSentinelFailoverCounts(t *testing.T) {
	redistest.Require(t)
	g := redistest.Sentinel(t)
	f := startFleet(t, 2, writeConfig(t), sentinelBackend(g))
	for i := range f.rls {
		f.warm(i)
	}
	awayFromWindowEnd(t, 2*time.Minute)

	const keys, workers = 4, 8
	values := make([]string, keys)
	for k := range values {
		values[k] = freshValue()
	}
	perKey := make([]tally, keys)
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var local tally
			k := w % keys
			defer func() { mu.Lock(); perKey[k].merge(local); mu.Unlock() }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := call(f.rls[w%len(f.rls)], "big", values[k], nil, 0)
				local.add(resp, err)
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(time.Second)
	old := g.Master()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := g.Sentinels[0].Do(ctx, "SENTINEL", "FAILOVER", redistest.MasterName)
	cancel()
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	failoverAt := time.Now()
	nm := g.WaitFailover(old, 30*time.Second)
	promoted := time.Since(failoverAt)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()

	var total tally
	admitted, counted := 0, 0
	for k, v := range values {
		c := bigLimit - int(f.remaining(k%len(f.rls), "big", v))
		total.merge(perKey[k])
		admitted += perKey[k].ok()
		counted += c
		if c != perKey[k].ok() {
			t.Errorf("key %d: %d admitted (%v), %d counted by the store: %d admitted hits lost", k, perKey[k].ok(), perKey[k], c, perKey[k].ok()-c)
		}
	}
	t.Logf("SENTINEL FAILOVER %s -> %s (new master answering after %v): %v over %d keys; %d admitted, %d counted, %d lost",
		old.Addr(), nm.Addr(), promoted.Round(time.Millisecond), total, keys, admitted, counted, admitted-counted)
	t.Logf("backend errors by cause: %v", f.backendErrors())
	if n := total.errors(); n > 0 {
		t.Errorf("%d calls without a deadline returned an error (a failing store is never an error)", n)
	}
}
