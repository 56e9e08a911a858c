package redis_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// lossCallers is how many callers each test of a connection loss runs:
// each has at most one call in flight, so at most this many calls can be
// on the connections a CLIENT KILL drops.
const lossCallers = 32

// lossStore is a Store on srv whose circuit openings are counted in
// opened.
func lossStore(t *testing.T, srv *redistest.Server, opened *atomic.Int64) *redis.Store {
	t.Helper()
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	return lossStoreOf(t, o, opened)
}

// lossStoreOf is lossStore with o. The timeout is long: these tests count
// failures by cause, and a starved host must not add timeouts to them.
func lossStoreOf(t *testing.T, o redis.Options, opened *atomic.Int64) *redis.Store {
	t.Helper()
	o.Timeout = 2 * time.Second
	o.MaxWait = stateWithin
	o.Breaker.OnTransition = func(to redis.BreakerState) {
		if to == redis.BreakerOpen {
			opened.Add(1)
		}
	}
	s := openStore(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// lossLoad runs lossCallers callers making Takes on s until stop is
// closed or each made max calls, and returns the causes of the failed
// calls with their counts and the number of calls made; done counts the
// calls as they end.
func lossLoad(s *redis.Store, stop <-chan struct{}, max int, done *atomic.Int64) (failed map[string]int, calls int) {
	var mu sync.Mutex
	failed = map[string]int{}
	var wg sync.WaitGroup
	for g := range lossCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 30, Period: time.Hour}
			for i := 0; i < max; i++ {
				select {
				case <-stop:
					return
				default:
				}
				hit := []algo.Hit{{Key: fmt.Sprintf("loss:%d:%d", g, i%16), Limit: l, Cost: 1}}
				_, err := algotest.Take(context.Background(), s, hit)
				done.Add(1)
				mu.Lock()
				calls++
				if err != nil {
					failed[redis.CauseOf(err)]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed, calls
}

// killClients closes every normal client connection of srv (the Store's)
// and returns how many.
func killClients(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	n, err := srv.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal")
	if err != nil {
		t.Errorf("CLIENT KILL: %v", err)
		return 0
	}
	k, _ := n.(int64)
	return k
}

// TestConnLossKeepsCircuitClosed: CLIENT KILL of every connection of the
// Store in the middle of a burst of 20,000 Takes from 32 callers, while
// Redis still accepts connections and answers: only the calls in flight
// on the killed connections fail (at most one per caller, their outcome
// unknown, cause reset), and the circuit never opens.
func TestConnLossKeepsCircuitClosed(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	// Whether the calls dropped together come in a run depends on the
	// scheduling: several rounds, each with its own Store.
	for round := range 3 {
		t.Run(fmt.Sprint("round ", round), func(t *testing.T) {
			var opened atomic.Int64
			connLossRound(t, lossStore(t, srv, &opened), &opened, srv)
		})
	}
}

// TestConnLossClusterKeepsCircuitsClosed is TestConnLossKeepsCircuitClosed
// on a 3-master Cluster, every master's connections killed at once: no
// master's circuit opens.
func TestConnLossClusterKeepsCircuitsClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	o := redis.DefaultOptions()
	o.Mode = redis.Cluster
	o.URL = ""
	o.Addrs = g.Addrs()
	o.DialTimeout = 2 * time.Second
	for round := range 2 {
		t.Run(fmt.Sprint("round ", round), func(t *testing.T) {
			var opened atomic.Int64
			connLossRound(t, lossStoreOf(t, o, &opened), &opened, g.Nodes...)
		})
	}
}

// connLossRound runs the burst on s, kills the normal clients of srvs
// once in its middle and checks that only calls in flight failed and that
// no circuit opened (opened counts s' openings).
func connLossRound(t *testing.T, s *redis.Store, opened *atomic.Int64, srvs ...*redistest.Server) {
	var done atomic.Int64
	killed := make(chan int64, 1)
	go func() {
		for done.Load() < 2000 {
			time.Sleep(time.Millisecond)
		}
		var k int64
		for _, srv := range srvs {
			k += killClients(t, srv)
		}
		killed <- k
	}()
	failed, calls := lossLoad(s, nil, 20000/lossCallers, &done)
	k := <-killed
	t.Logf("%d calls, %d connections killed, failed by cause %v", calls, k, failed)
	if k == 0 {
		t.Fatal("CLIENT KILL killed no connection")
	}
	if n := opened.Load(); n != 0 {
		t.Errorf("the circuit opened %d times on one CLIENT KILL, want never", n)
	}
	total := 0
	for cause, n := range failed {
		total += n
		if cause != redis.CauseReset {
			t.Errorf("%d calls failed with cause %q, want only %q (the calls in flight on the killed connections)", n, cause, redis.CauseReset)
		}
	}
	// A caller whose call was dropped makes its next one on a new
	// connection: two per caller leave room for one that picked a
	// pooled connection killed but not yet seen closed.
	if total > 2*lossCallers {
		t.Errorf("%d calls failed, want at most %d (2 per caller: those in flight on the killed connections)", total, 2*lossCallers)
	}
	if st := s.BreakerState(); st != "closed" || !s.Healthy() {
		t.Errorf("after the burst: circuit %s, healthy %v; want closed and healthy", st, s.Healthy())
	}
}

// TestConnLossRepeatedOpensCircuit: when the connections are killed again
// and again (every 20 ms, as by a proxy that closes them), they cannot be
// kept: Failures losses within the breaker's Window open the circuit, and
// the calls then get circuit_open.
func TestConnLossRepeatedOpensCircuit(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	var opened atomic.Int64
	s := lossStore(t, srv, &opened)
	var done atomic.Int64
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		for end := time.Now().Add(time.Second); time.Now().Before(end) && opened.Load() == 0; {
			killClients(t, srv)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	failed, calls := lossLoad(s, stop, 1<<30, &done)
	t.Logf("%d calls, failed by cause %v", calls, failed)
	if opened.Load() == 0 {
		t.Fatal("the circuit never opened with every connection killed every 20 ms for 1 s")
	}
	for cause := range failed {
		if !slices.Contains([]string{redis.CauseReset, redis.CauseRefused, redis.CauseCircuitOpen}, cause) {
			t.Errorf("cause %q, want reset, refused or circuit_open", cause)
		}
	}
}

// TestConnLossRedisKilledOpensCircuit: Redis killed mid-burst (its port
// closed: new dials refused) still opens the circuit at once: the calls in
// flight are one loss, and the refused dials after it a run of proven
// failures. Before it opens a caller fails at most three times: its call
// in flight at the kill, one on a pooled connection killed but not yet
// seen closed, and one in flight when the circuit opens.
func TestConnLossRedisKilledOpensCircuit(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	var opened atomic.Int64
	s := lossStore(t, srv, &opened)
	var done atomic.Int64
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		for done.Load() < 2000 {
			time.Sleep(time.Millisecond)
		}
		srv.Kill()
		for start := time.Now(); opened.Load() == 0 && time.Since(start) < stateWithin; {
			time.Sleep(time.Millisecond)
		}
		// A little traffic on the open circuit.
		for at := done.Load(); done.Load() < at+1000; {
			time.Sleep(time.Millisecond)
		}
	}()
	failed, calls := lossLoad(s, stop, 1<<30, &done)
	t.Logf("%d calls, failed by cause %v", calls, failed)
	if opened.Load() == 0 {
		t.Fatalf("the circuit never opened within %v of Redis killed", stateWithin)
	}
	if failed[redis.CauseCircuitOpen] == 0 {
		t.Error("no call failed with circuit_open after Redis was killed")
	}
	others := 0
	for cause, n := range failed {
		switch cause {
		case redis.CauseCircuitOpen:
		case redis.CauseReset, redis.CauseRefused:
			others += n
		default:
			t.Errorf("%d calls failed with cause %q, want reset, refused or circuit_open", n, cause)
		}
	}
	if limit := 3 * lossCallers; others > limit {
		t.Errorf("%d calls failed reset or refused before the circuit opened, want at most %d", others, limit)
	}
}
