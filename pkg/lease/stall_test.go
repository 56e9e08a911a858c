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
// units and on keys never leased. Each decision is allowed from the units
// in hand, exactly as many as the lease held at the freeze, or fails with
// a store error, never the caller's own deadline, so that the rule's
// failure_mode decides it. No decision waits for the frozen store: none
// lasts as long as a renewal stuck on it (Options.Timeout), however late
// a loaded host schedules it. The failed renewals are logged and
// counted. After SIGCONT the leases renew: fresh keys are granted again.
func TestLeasedRedisFrozen(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	// A renewal stuck on the frozen store lasts timeout, the Leaser's
	// bound, many times the callers' deadline: a decision that waited
	// for the store would last as long, one that did not is late only by
	// the host's scheduling.
	const timeout = 5 * time.Second
	o := redis.DefaultOptions() // the server's, but MaxWait
	o.URL = srv.URL()
	o.MaxWait = 2 * timeout // it bounds socket reads too: leave timeout the bound
	st, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	// Renewals start only from hits (no ticks), so none is in flight at
	// the freeze and the units in hand stay what they were.
	ls, err := New(Options{Store: st, Registerer: reg, Timeout: timeout, Ticker: noTicks,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ls.Close(context.Background()) })
	// A fresh Redis grants nothing in the window it started in (its
	// restart guard), so the window is short; long enough that the units
	// in hand outlast the burst on a loaded host.
	const period = 4 * time.Second
	const (
		callers  = 16
		per      = 20
		warmHits = callers * per / 2 // every other decision of the burst
		deadline = 300 * time.Millisecond
	)
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
		return len(f) == 0 && d[0].Allowed && d[0].Remaining > 0
	})
	// A lease holds what the division gives its demand (the floor only
	// starts a newcomer): raise the warm key's demand to the burst's, so
	// that the units in hand are of the burst's size.
	for range warmHits {
		ls.Take(context.Background(), hit("warm"))
	}
	// The burst may spend what the lease holds now.
	quiet(t, ls)
	warm := ls.entries["warm"]
	warm.mu.Lock()
	held, heldWS := warm.avail, warm.ws
	warm.mu.Unlock()
	if held <= 0 {
		t.Fatalf("the warm lease holds %d units before the freeze", held)
	}

	srv.Stop()
	t.Cleanup(func() {
		if srv.Alive() {
			srv.Cont()
		}
	})
	var allowed, failed, callerDeadline, otherErr atomic.Int64
	var mu sync.Mutex
	var took []time.Duration
	// lag is the longest this process waited to be scheduled during the
	// burst (reported: a loaded host may wake a decision that late).
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
				ownErr := err != nil && err == ctx.Err() // returned as is, unwrapped
				cancel()
				mu.Lock()
				took = append(took, took1)
				mu.Unlock()
				switch {
				case len(f) > 0:
					failed.Add(1)
					var ce interface{ Cause() string }
					switch {
					case ownErr:
						callerDeadline.Add(1)
					case !errors.As(err, &ce):
						otherErr.Add(1) // not a store error with a cause
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
		if d >= timeout {
			late++
		}
	}
	warm.mu.Lock()
	sameWindow := warm.ws == heldWS
	warm.mu.Unlock()
	slices.Sort(took)
	t.Logf("Redis frozen: decision time p50 %v, p90 %v, max %v", took[len(took)/2], took[len(took)*9/10], took[len(took)-1])
	t.Logf("Redis frozen: %d decisions: %d allowed from %d units in hand, %d failed (%d by the caller's deadline), %d as long as a renewal (scheduling lag up to %v)",
		callers*per, allowed.Load(), held, failed.Load(), callerDeadline.Load(), late, time.Duration(lag.Load()))
	if late > 0 {
		t.Errorf("%d of %d leased decisions lasted %v, as long as a renewal stuck on the frozen store: they waited for it", late, callers*per, timeout)
	}
	if n := callerDeadline.Load(); n > 0 {
		t.Errorf("%d of %d leased decisions ran into the caller's deadline: the rule's failure_mode cannot decide them", n, callers*per)
	}
	if n := otherErr.Load(); n > 0 {
		t.Errorf("%d of %d leased decisions failed with an error that is not the store's", n, callers*per)
	}
	if failed.Load() < callers*per-warmHits {
		t.Errorf("%d failed decisions, want at least the %d on never-leased keys", failed.Load(), callers*per-warmHits)
	}
	// The warm key's hits spend the units in hand, no more; all of them
	// when the burst stayed in the window they belong to.
	want := min(held, warmHits)
	switch a := allowed.Load(); {
	case a > held:
		t.Errorf("%d decisions allowed with Redis frozen, more than the %d units in hand", a, held)
	case sameWindow && a != want:
		t.Errorf("%d decisions allowed from %d units in hand, want %d", a, held, want)
	}

	// The renewals stuck on the frozen server end by Options.Timeout.
	waitFor(t, timeout+5*time.Second, "a logged and counted renewal failure", func() bool {
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
