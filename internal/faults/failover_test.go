package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestSentinelFailoverCounts: 8 callers (no deadline) on 4 keys, over 2
// instances in Sentinel mode, run before, during and after a `SENTINEL
// FAILOVER`, on the deployment documented to lose no counted hit
// (min-replicas-to-write 1, --redis-wait-replicas=1). Per key, the store's
// count must be at least the OK answers the store decided (a lost hit
// would over-admit) and at most the answers that may have reached Redis
// (decided, failed open or an error). Failing open while the master
// refuses writes is the rule's metered failure mode.
func TestSentinelFailoverCounts(t *testing.T) {
	redistest.Require(t)
	// repl-diskless-sync-delay 0: the old master's resync starts at once
	// (the default waits 5 s for more replicas).
	g := redistest.Sentinel(t, redistest.WithArgs("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10", "--repl-diskless-sync-delay", "0"))
	perKey, counted := failoverRun(t, g, "--redis-wait-replicas=1")
	var total tally
	sumCounted := 0
	for k, tl := range perKey {
		total.merge(tl)
		sumCounted += counted[k]
		if counted[k] < tl.decided || counted[k] > tl.ok()+tl.errors() {
			t.Errorf("key %d: %v, %d counted by the store; want %d <= counted <= %d (lost: %d)",
				k, tl, counted[k], tl.decided, tl.ok()+tl.errors(), max(0, tl.decided-counted[k]))
		}
	}
	t.Logf("%v over %d keys; %d counted, decided OK lost: %d", total, len(perKey), sumCounted, max(0, total.decided-sumCounted))
}

// loadCalls is how many calls the store decides before and after the
// failover of TestSentinelFailoverCounts, at least.
const loadCalls = 100

// failoverRun starts 2 instances on g with extra flags, runs the load of
// TestSentinelFailoverCounts around a `SENTINEL FAILOVER`, and returns the
// answers and the store's count per key.
func failoverRun(t *testing.T, g *redistest.SentinelGroup, extra ...string) ([]tally, []int) {
	t.Helper()
	f := startFleet(t, 2, writeConfig(t), sentinelBackend(g), extra...)
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
	var decided atomic.Int64 // answers decided by the store so far
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
				if classify(resp, err) == okDecided {
					decided.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	// The load runs for a second and loadCalls decided calls before the
	// failover, and as long again after it (a count, so that a slow run
	// does as much as a fast one).
	waitLoad := func(what string) {
		t.Helper()
		from, start := decided.Load(), time.Now()
		for time.Since(start) < time.Second || decided.Load()-from < loadCalls {
			if time.Since(start) > time.Minute {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: %d calls decided by the store in %v; want %d", what, decided.Load()-from, time.Minute, loadCalls)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitLoad("before the failover")
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
	// The sentinels turn the old master into a replica of the new one
	// within their 10 s INFO period; until it is in sync, a master with
	// min-replicas-to-write refuses writes.
	waitOnlineReplica(t, nm, time.Minute)
	synced := time.Since(failoverAt)
	waitLoad("after the failover")
	close(stop)
	wg.Wait()

	counted := make([]int, keys)
	for k, v := range values {
		counted[k] = bigLimit - int(f.remaining(k%len(f.rls), "big", v))
	}
	t.Logf("SENTINEL FAILOVER %s -> %s (new master answering after %v, with a replica in sync after %v), flags %v; backend errors by cause %v",
		old.Addr(), nm.Addr(), promoted.Round(time.Millisecond), synced.Round(time.Millisecond), extra, f.backendErrors())
	return perKey, counted
}

// waitOnlineReplica waits until master reports a replica in sync
// (INFO replication: a slave0 line with state=online), failing t after
// within.
func waitOnlineReplica(t *testing.T, master *redistest.Server, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := master.Do(ctx, "INFO", "replication")
		cancel()
		if err == nil && strings.Contains(fmt.Sprint(info), "state=online") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has no replica in sync after %v: %v %v", master.Addr(), within, info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
