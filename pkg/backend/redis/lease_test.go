package redis_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

var leaseLimits = []algo.Limit{
	{Kind: algo.FixedWindow, Rate: 50, Period: time.Second},
	{Kind: algo.SlidingWindow, Rate: 50, Period: time.Second},
	{Kind: algo.TokenBucket, Rate: 50, Period: time.Second, Burst: 20},
	{Kind: algo.TokenBucket, Rate: 7, Period: 3 * time.Second},
}

// leaseAgrees drives the same random lease operations (several
// subscribers, returns, demands, time passing across windows) through
// the Redis store and the memory store, whose Lease is algo.Lease under a
// lock, on one pinned clock, and fails on the first different grant. It
// starts 4 s after the Redis store (created at epoch0), past what the
// Redis store assumes lost before its start and the memory store does not
// (TestLeaseBeforeStart).
func leaseAgrees(t *testing.T, s *redis.Store, clk *pinnedClock, key string) {
	ctx := context.Background()
	for _, l := range leaseLimits {
		t.Run(kindName(l), func(t *testing.T) {
			clk.Set(epoch0.Add(4 * time.Second))
			ref, err := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(l.Kind), uint64(l.Rate)))
			k := key + ":" + kindName(l) + ":" + l.Period.String()
			held := map[int64]int64{} // per subscriber, in the window heldWS
			heldWS := int64(0)
			for i := range 400 {
				clk.Advance(time.Duration(rng.Int64N(int64(l.Period/8))) + time.Microsecond)
				sub := 1 + rng.Int64N(3)
				ws, _ := algo.WindowBoundsUs(l, clk.Now().UnixMicro())
				if ws != heldWS && l.Kind != algo.TokenBucket {
					clear(held)
					heldWS = ws
				}
				req := algo.LeaseRequest{
					Key: k, Limit: l, Subscriber: sub, Demand: rng.Int64N(40),
					Want: rng.Int64N(30), Stale: l.Period.Microseconds() / 2,
				}
				if h := held[sub]; h > 0 && rng.IntN(3) == 0 {
					req.Return, req.ReturnWindow = 1+rng.Int64N(h), ws
				}
				want, err := ref.Lease(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				got, err := s.Lease(ctx, req)
				if err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
				if got.Granted != want.Granted || got.Remaining != want.Remaining || got.Now != want.Now || !slices.Equal(got.Demands, want.Demands) {
					t.Fatalf("op %d %+v:\nredis  %+v\nmemory %+v", i, req, got, want)
				}
				held[sub] += got.Granted - req.Return
			}
		})
	}
}

// A Redis store grants nothing more in a window that began before its
// start (units leased before a restart may still be held by other
// instances), where a new memory store grants the whole limit (no lease
// from before it exists).
func TestLeaseBeforeStart(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	clk := newPinnedClock(epoch0) // 535 ms into a second
	s := newTestStore(t, srv, clk.Now, 0)
	ref, err := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ref.Close() }()
	clk.Advance(100 * time.Millisecond)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 50, Period: time.Second}
	req := algo.LeaseRequest{Key: "born", Limit: l, Subscriber: 1, Want: 10, Stale: 1e6}
	if g, err := s.Lease(context.Background(), req); err != nil || g.Granted != 0 {
		t.Errorf("redis, window begun before the store: granted %d (%v), want 0", g.Granted, err)
	}
	if g, _ := ref.Lease(context.Background(), req); g.Granted != 10 {
		t.Errorf("memory, window begun before the store: granted %d, want 10", g.Granted)
	}
	clk.Advance(time.Second)
	if g, err := s.Lease(context.Background(), req); err != nil || g.Granted != 10 {
		t.Errorf("redis, next window: granted %d (%v), want 10", g.Granted, err)
	}
}

func TestLeaseAgrees(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	clk := newPinnedClock(epoch0)
	leaseAgrees(t, newTestStore(t, srv, clk.Now, 0), clk, "agree")
}

func TestLeaseAgreesCluster(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	clk := newPinnedClock(epoch0)
	leaseAgrees(t, newClusterStore(t, g, clk.Now), clk, "agree")
}

// Many goroutines on three Stores lease from fixed windows of 100 ms on
// the server's clock, for at least 1.5 s and until three windows were
// granted their whole limit: the units granted in each window never
// exceed the limit, and when asked for more, whole windows are granted.
// A loaded host only makes it run longer (a window boundary passing
// during a call is followed, see TestLeaseFollowsMovingWindow).
func TestLeaseConcurrentNeverAboveLimit(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	stores := []*redis.Store{newTestStore(t, srv, nil, 0), newTestStore(t, srv, nil, 0), newTestStore(t, srv, nil, 0)}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 500, Period: 100 * time.Millisecond}
	p := l.Period.Microseconds()
	const wantFull = 3
	// A window that began before the server did grants nothing, and the
	// server's start is known to the second.
	time.Sleep(1200 * time.Millisecond)
	var mu sync.Mutex
	perWindow := map[int64]int64{} // units granted by the window of the server's now
	full := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[i%3]
			for {
				select {
				case <-stop:
					return
				default:
				}
				g, err := s.Lease(context.Background(), algo.LeaseRequest{Key: "conc", Limit: l, Subscriber: int64(1 + i%3), Want: 7, Stale: 1e6})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ws := g.Now - g.Now%p
				before := perWindow[ws]
				perWindow[ws] += g.Granted
				if before < l.Rate && perWindow[ws] >= l.Rate {
					full++
				}
				mu.Unlock()
			}
		}()
	}
	minEnd, deadline := time.Now().Add(1500*time.Millisecond), time.Now().Add(time.Minute)
	for {
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		n := full
		mu.Unlock()
		if (n >= wantFull && time.Now().After(minEnd)) || time.Now().After(deadline) {
			break
		}
	}
	close(stop)
	wg.Wait()
	full = 0
	for ws, n := range perWindow {
		if n > l.Rate {
			t.Errorf("window %d: %d units granted > limit %d", ws, n, l.Rate)
		}
		if n == l.Rate {
			full++
		}
	}
	if full < wantFull {
		t.Fatalf("%d of %d windows were granted their whole limit %d within a minute, want %d: %v", full, len(perWindow), l.Rate, wantFull, perWindow)
	}
	t.Logf("%d windows, %d granted the whole limit", len(perWindow), full)
}

// scriptDelay is a go-redis hook that sleeps d before each of the first n
// script calls (every one when n < 0) and counts the script calls.
type scriptDelay struct {
	d     time.Duration
	mu    sync.Mutex
	n     int
	calls int
}

func (h *scriptDelay) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *scriptDelay) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (h *scriptDelay) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.mu.Lock()
			h.calls++
			delay := h.n < 0 || h.calls <= h.n
			h.mu.Unlock()
			if delay {
				time.Sleep(h.d)
			}
		}
		return next(ctx, cmd)
	}
}

func (h *scriptDelay) Calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// windowUnits is the sum of the lease counters of base's fixed windows
// (keys "{base}:<ws>") on srv.
func windowUnits(t *testing.T, srv *redistest.Server, base string) int64 {
	t.Helper()
	ctx := context.Background()
	keys, err := srv.Client().Keys(ctx, "{"+base+"}:[0-9]*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, k := range keys {
		n, err := srv.Client().Get(ctx, k).Int64()
		if err != nil {
			t.Fatal(err)
		}
		sum += n
	}
	return sum
}

// A lease whose window moves while it is under way (each of its first
// three calls reaches the server a whole period after the window it
// carries was read) is sent again with the server's window until the
// windows agree: it is granted in the server's window, and the calls of
// the windows that had ended wrote nothing.
func TestLeaseFollowsMovingWindow(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	s := newTestStore(t, srv, nil, 0)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: 50 * time.Millisecond}
	ctx := context.Background()
	// See TestLeaseConcurrentNeverAboveLimit; the first lease also loads
	// the script.
	time.Sleep(1200 * time.Millisecond)
	if _, err := s.Lease(ctx, algo.LeaseRequest{Key: "warm", Limit: l, Subscriber: 1, Want: 1, Stale: 1e6}); err != nil {
		t.Fatal(err)
	}
	h := &scriptDelay{d: l.Period, n: 3}
	s.AddClientHook(h)
	g, err := s.Lease(ctx, algo.LeaseRequest{Key: "moving", Limit: l, Subscriber: 1, Want: 10, Stale: 1e6})
	if err != nil {
		t.Fatalf("lease across three window moves: %v", err)
	}
	if g.Granted != 10 {
		t.Errorf("granted %d, want 10", g.Granted)
	}
	if c := h.Calls(); c < 4 {
		t.Errorf("%d script calls, want at least 4 (three moved windows)", c)
	}
	if n := windowUnits(t, srv, "moving"); n != g.Granted {
		t.Errorf("the windows count %d units, granted %d", n, g.Granted)
	}
}

// A lease whose window moves at every call (each reaches the server a
// whole period late) ends with its context, granting and writing nothing.
func TestLeaseMovingWindowBoundedByContext(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	s := newTestStore(t, srv, nil, 0)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: 20 * time.Millisecond}
	time.Sleep(1200 * time.Millisecond)
	if _, err := s.Lease(context.Background(), algo.LeaseRequest{Key: "warm", Limit: l, Subscriber: 1, Want: 1, Stale: 1e6}); err != nil {
		t.Fatal(err)
	}
	h := &scriptDelay{d: l.Period, n: -1}
	s.AddClientHook(h)
	// The socket's deadline is the context's, so the error may be the
	// socket's timeout, at the context's deadline.
	deadline := time.Now().Add(10 * l.Period)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	g, err := s.Lease(ctx, algo.LeaseRequest{Key: "moving", Limit: l, Subscriber: 1, Want: 10, Stale: 1e6})
	if err == nil || time.Now().Before(deadline) {
		t.Fatalf("lease with a window moving at every call: %+v, %v before its context's deadline, want a timeout at it", g, err)
	}
	if c := redis.CauseOf(err); c != redis.CauseTimeout {
		t.Errorf("cause %q (%v), want %q", c, err, redis.CauseTimeout)
	}
	if g.Granted != 0 {
		t.Errorf("granted %d, want 0", g.Granted)
	}
	if n := windowUnits(t, srv, "moving"); n != 0 {
		t.Errorf("the windows count %d units, want 0", n)
	}
}

// After a restart the server has forgotten the units it leased, which
// their holders may still be using: a window that began before the
// restart grants nothing more, nor does a token bucket until it could
// have refilled.
func TestLeaseAfterRestart(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	s := newTestStore(t, srv, nil, 0)
	ctx := context.Background()
	fw := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Hour}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 100, Period: time.Hour}
	srv.Restart()
	for _, l := range []algo.Limit{fw, tb} {
		var g algo.LeaseGrant
		var err error
		for range 50 { // the store reconnects
			if g, err = s.Lease(ctx, algo.LeaseRequest{Key: "rs:" + kindName(l), Limit: l, Subscriber: 1, Want: 10, Stale: 1e6}); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		if g.Granted != 0 {
			t.Errorf("%s: granted %d right after a restart, want 0", kindName(l), g.Granted)
		}
	}
}
