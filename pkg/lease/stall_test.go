package lease

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// syncBuffer is a log sink safe for the renewal goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLeasedRedisFrozen: with Redis frozen (SIGSTOP), 16 callers make
// leased decisions with a 300 ms deadline, on a key whose lease holds
// units and on keys never leased. Every decision ends before the
// caller's deadline: allowed from the units in hand, or failed with a
// store error (never the caller's own deadline), so that the rule's
// failure_mode decides it. The failed renewals are logged and counted.
// After SIGCONT the leases renew: fresh keys are granted again.
func TestLeasedRedisFrozen(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	st, err := redis.New(o) // the default options, as the server runs them
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	// No periodic renewal between the warm-up and the burst: it would
	// shrink the warm lease to the warm-up's small demand.
	ls, err := New(Options{Store: st, Registerer: reg, Interval: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ls.Close(context.Background()) })
	// A fresh Redis grants nothing in the window it started in (its
	// restart guard), so the window is short; long enough that the units
	// in hand outlast the burst on a loaded host.
	const period = 4 * time.Second
	lim := algo.Limit{Kind: algo.FixedWindow, Rate: 64_000, Period: period}
	hit := func(key string) []algo.Hit { return []algo.Hit{{Key: key, Limit: lim, Cost: 1}} }
	waitFor(t, 2*period, "warm-up grant", func() bool {
		d, f, _, _ := ls.Take(context.Background(), hit("warm"))
		return len(f) == 0 && d[0].Allowed
	})
	// Lease again at the start of the next window, so that the units in
	// hand last most of a window into the freeze.
	next := time.UnixMilli((time.Now().UnixMilli()/period.Milliseconds() + 1) * period.Milliseconds())
	time.Sleep(time.Until(next.Add(20 * time.Millisecond)))
	waitFor(t, 5*time.Second, "grant in a new window", func() bool {
		d, f, _, _ := ls.Take(context.Background(), hit("warm"))
		return len(f) == 0 && d[0].Allowed
	})

	srv.Stop()
	t.Cleanup(func() {
		if srv.Alive() {
			srv.Cont()
		}
	})
	const (
		callers  = 16
		per      = 20
		deadline = 300 * time.Millisecond
		slack    = 150 * time.Millisecond // wake-up latency allowed past a deadline
	)
	var allowed, failed, callerDeadline atomic.Int64
	var mu sync.Mutex
	var took []time.Duration
	// lag is the longest this process waited to be scheduled during the
	// burst: a decision may end that much past deadline+slack on a
	// loaded host without the Leaser having waited on the store.
	var lag atomic.Int64
	stopLag := make(chan struct{})
	lagDone := make(chan struct{})
	go func() {
		defer close(lagDone)
		for {
			select {
			case <-stopLag:
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(time.Millisecond)
			if l := int64(time.Since(t0) - time.Millisecond); l > lag.Load() {
				lag.Store(l)
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range per {
				key := "warm"
				if i%2 == 1 {
					key = "cold" + strconv.Itoa(g*per+i)
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				t0 := time.Now()
				d, f, _, err := ls.Take(ctx, hit(key))
				took1 := time.Since(t0)
				cancel()
				mu.Lock()
				took = append(took, took1)
				mu.Unlock()
				switch {
				case len(f) > 0:
					failed.Add(1)
					if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
						callerDeadline.Add(1)
					}
				case d[0].Allowed:
					allowed.Add(1)
				default:
					t.Errorf("%s denied with Redis frozen: %+v", key, d[0])
				}
			}
		})
	}
	wg.Wait()
	close(stopLag)
	<-lagDone
	late := 0
	for _, d := range took {
		if d > deadline+slack+time.Duration(lag.Load()) {
			late++
		}
	}
	slices.Sort(took)
	t.Logf("Redis frozen: decision time p50 %v, p90 %v, max %v", took[len(took)/2], took[len(took)*9/10], took[len(took)-1])
	t.Logf("Redis frozen: %d decisions: %d allowed from units in hand, %d failed (%d by the caller's deadline), %d past deadline+slack+lag (lag %v)",
		callers*per, allowed.Load(), failed.Load(), callerDeadline.Load(), late, time.Duration(lag.Load()))
	if late > 0 {
		t.Errorf("%d of %d leased decisions took longer than the caller's deadline %v (+%v, +%v scheduling lag)", late, callers*per, deadline, slack, time.Duration(lag.Load()))
	}
	if n := callerDeadline.Load(); n > 0 {
		t.Errorf("%d of %d leased decisions ran into the caller's deadline: the rule's failure_mode cannot decide them", n, callers*per)
	}
	if failed.Load() < callers*per/2 {
		t.Errorf("%d failed decisions, want at least the %d on never-leased keys", failed.Load(), callers*per/2)
	}
	if allowed.Load() == 0 {
		t.Error("no decision allowed from the units in hand")
	}

	// The renewals stuck on the frozen server end by Options.Timeout.
	waitFor(t, 5*time.Second, "a logged and counted renewal failure", func() bool {
		return strings.Contains(logs.String(), "lease: renewal failed") &&
			testutil.ToFloat64(ls.m.renewals.WithLabelValues("error")) > 0
	})

	srv.Cont()
	waitFor(t, 10*time.Second, "a lease granted after SIGCONT", func() bool {
		d, f, _, _ := ls.Take(context.Background(), hit("after"))
		return len(f) == 0 && d[0].Allowed
	})
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > within {
			t.Fatalf("no %s within %v", what, within)
		}
	}
}

// TestStalledWakeUpAfterBudget: a hit that waits for a renewal the store
// never answers ends with ErrRenewalStalled once its wait budget has
// passed, even when its goroutine wakes so late that the caller's
// deadline has passed too and the select picks ctx: the store is what
// did not answer, so the rule's failure_mode decides. Callers whose
// deadline has passed before they ask model that late wake-up (their
// budget is 0). A caller that cancels within its budget gets its own
// error.
func TestStalledWakeUpAfterBudget(t *testing.T) {
	release := make(chan struct{})
	var asked atomic.Int64
	st := storeFunc(func(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
		asked.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return algo.LeaseGrant{}, errors.New("store not answering")
	})
	// Renewals are bounded by an hour: none ends during the test.
	ls, err := New(Options{Store: st, Timeout: time.Hour, Ticker: noTicks, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(release)
		_ = ls.Close(context.Background())
	})
	lim := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Minute}
	const (
		callers = 16
		per     = 16
	)
	late, cancelLate := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancelLate()
	var stalled, callerErr, other atomic.Int64
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range per {
				key := "never-answered-" + strconv.Itoa(g*per+i)
				_, f, _, err := ls.Take(late, []algo.Hit{{Key: key, Limit: lim, Cost: 1}})
				switch {
				case len(f) == 0:
					other.Add(1)
				case errors.Is(err, ErrRenewalStalled):
					stalled.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					callerErr.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := callerErr.Load(); n > 0 {
		t.Errorf("%d of %d hits woken after their wait budget failed with the caller's deadline, want ErrRenewalStalled", n, callers*per)
	}
	if n := other.Load(); n > 0 {
		t.Errorf("%d of %d hits neither stalled nor failed by the caller's deadline", n, callers*per)
	}
	if asked.Load() == 0 {
		t.Error("no renewal reached the store")
	}
	t.Logf("%d hits past their wait budget: %d stalled, %d by the caller's deadline", callers*per, stalled.Load(), callerErr.Load())

	// A caller that gives up within its budget (no deadline: the budget
	// is Options.Timeout) gets its own error, not the store's.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	_, f, _, err2 := ls.Take(gone, []algo.Hit{{Key: "given-up", Limit: lim, Cost: 1}})
	if len(f) != 1 || !errors.Is(err2, context.Canceled) {
		t.Errorf("canceled caller: failed %v, error %v; want context.Canceled", f, err2)
	}
}
