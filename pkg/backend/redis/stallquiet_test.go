package redis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestStallEstablishedAfterPartialAnswer: Redis froze after answering
// one request but not an earlier one (SIGSTOP between two replies: here
// CLIENT PAUSE WRITE holds the earlier script while a PING is answered,
// then SIGSTOP). The stall is established once nothing has been received
// for FailFor, counted from the last byte received, not from the earliest
// unanswered request: calls with a 20 ms deadline then get the rules'
// failure modes (cause stalled), none is shed, and calls without a
// deadline are answered within a Timeout or so, not after MaxWait.
func TestStallEstablishedAfterPartialAnswer(t *testing.T) {
	srv, o := standaloneOptions(t)
	s := openStore(t, o)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 30, Period: time.Hour}
	take := func(ctx context.Context, key string) error {
		_, err := algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
		return err
	}
	waitHealthy(t, s, true, stateWithin, "start")
	ctx := context.Background()
	ctl := srv.Client()
	defer func() { _ = ctl.Close() }()

	// A script held by the pause: a request unanswered from now on.
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", 30000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() { held <- take(ctx, "held") }()
	// The paused script counts as a blocked client once Redis read it.
	waitFor := time.Now().Add(stateWithin)
	for {
		info, err := ctl.Info(ctx, "clients").Result()
		if err != nil {
			t.Fatal(err)
		}
		if redistest.InfoInt(t, info, "blocked_clients") >= 1 {
			break
		}
		if time.Now().After(waitFor) {
			t.Fatalf("the Store's script never reached the paused Redis:\n%s", info)
		}
		time.Sleep(time.Millisecond)
	}
	// Redis answers a later request on another connection, then freezes.
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("PING during CLIENT PAUSE WRITE: %v", err)
	}
	srv.Stop()
	stopped := time.Now()
	defer srv.Cont()

	type result struct {
		start    time.Time
		took     time.Duration
		deadline bool
		err      error
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	end := stopped.Add(o.Breaker.FailFor + 2500*time.Millisecond)
	for i := range 8 {
		withDeadline := i%2 == 0
		wg.Go(func() {
			for time.Now().Before(end) {
				cctx, cancel := ctx, context.CancelFunc(func() {})
				if withDeadline {
					cctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
				}
				start := time.Now()
				err := take(cctx, fmt.Sprintf("k%d", i))
				took := time.Since(start)
				cancel()
				mu.Lock()
				results = append(results, result{start, took, withDeadline, err})
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	<-held

	// FailFor of silence after the PING's reply, plus half a second for
	// the calls already waiting then.
	from := stopped.Add(o.Breaker.FailFor + 500*time.Millisecond)
	n, shed, slow := 0, 0, 0
	causes := map[string]int{}
	var worst time.Duration
	for _, r := range results {
		if r.start.Before(from) {
			continue
		}
		n++
		cause := redis.CauseOf(r.err)
		causes[cause]++
		worst = max(worst, r.took)
		if r.deadline && cause != redis.CauseStalled {
			shed++
		}
		if !r.deadline && r.took > 500*time.Millisecond {
			slow++
		}
	}
	t.Logf("%d calls once the stall was established: %d with a 20 ms deadline not answered as stalled, %d without a deadline slower than 500 ms; slowest %v; causes %v",
		n, shed, slow, worst, causes)
	if n < 20 {
		t.Fatalf("only %d calls once the stall was established", n)
	}
	if shed > 0 || slow > 0 {
		t.Errorf("stall after a partial answer: %d calls with a deadline not given the failure mode (cause stalled), %d calls without a deadline slower than 500 ms; want 0 and 0", shed, slow)
	}
}
