package memory_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// A new store grants a leased limit's whole rate in the window it began
// in, whatever the window's length: no lease from before it exists, so a
// fresh process does not deny its first hits until the window ends.
func TestLeaseAfterStart(t *testing.T) {
	start := time.Date(2026, 5, 1, 10, 30, 30, 0, time.UTC)
	for _, c := range []struct {
		l     algo.Limit
		grant int64
	}{
		{algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}, 1000},
		{algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: 24 * time.Hour}, 1000},
		{algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Minute}, 10},
		{algo.Limit{Kind: algo.SlidingWindow, Rate: 10, Period: time.Minute}, 10},
		{algo.Limit{Kind: algo.TokenBucket, Rate: 10, Period: time.Minute}, 10},
	} {
		now := start
		s, err := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		now = start.Add(time.Second)
		g, _ := s.Lease(context.Background(), algo.LeaseRequest{Key: "a", Limit: c.l, Subscriber: 1, Want: 5000, Stale: 1})
		if g.Granted != c.grant {
			t.Errorf("%v per %v, a second after the store began: granted %d, want %d", c.l.Kind, c.l.Period, g.Granted, c.grant)
		}
		_ = s.Close()
	}
}

// Many goroutines lease from one window of a pinned clock: the grants sum
// to exactly the limit; returns in the window make room again, and a
// subscriber's demand is listed until it is Stale.
func TestLease(t *testing.T) {
	now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s, err := memory.New(memory.Options{Now: clock, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []algo.Limit{
		{Kind: algo.FixedWindow, Rate: 300, Period: time.Minute},
		{Kind: algo.SlidingWindow, Rate: 300, Period: time.Minute},
		{Kind: algo.TokenBucket, Rate: 300, Period: time.Minute},
	} {
		key := "k" + string(rune('0'+l.Kind))
		var granted atomic.Int64
		var wg sync.WaitGroup
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 50 {
					g, err := s.Lease(context.Background(), algo.LeaseRequest{Key: key, Limit: l, Subscriber: int64(1 + i%4), Demand: 9, Want: 3, Stale: 1e6})
					if err != nil {
						t.Error(err)
						return
					}
					granted.Add(g.Granted)
				}
			}()
		}
		wg.Wait()
		if n := granted.Load(); n != l.Rate {
			t.Fatalf("%v: granted %d of 4800 asked, want the limit %d", l.Kind, n, l.Rate)
		}
		ws, _ := algo.WindowBoundsUs(l, now.UnixMicro())
		g, _ := s.Lease(context.Background(), algo.LeaseRequest{Key: key, Limit: l, Subscriber: 1, Want: 10, Return: 4, ReturnWindow: ws, Stale: 1e6})
		if g.Granted != 4 || g.Remaining != 0 {
			t.Fatalf("%v: after returning 4, granted %d remaining %d; want 4 and 0", l.Kind, g.Granted, g.Remaining)
		}
		if len(g.Demands) != 4 || g.Demands[0].Subscriber != 1 || g.Demands[3].Demand != 9 {
			t.Fatalf("%v: demands %+v, want subscribers 1..4", l.Kind, g.Demands)
		}
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	g, _ := s.Lease(context.Background(), algo.LeaseRequest{Key: "k0", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 300, Period: time.Minute}, Subscriber: 7, Stale: 1e6})
	if len(g.Demands) != 1 || g.Demands[0].Subscriber != 7 {
		t.Fatalf("demands after 2 s with Stale 1 s: %+v, want only subscriber 7", g.Demands)
	}
}

// A lease counts on the state Take decides for its key: units leased are
// seen charged by the exact hits on the key, the units the hits took are
// not leased again, and units given back are admitted again.
func TestLeaseSharesTake(t *testing.T) {
	now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	ctx := context.Background()
	for _, l := range []algo.Limit{
		{Kind: algo.FixedWindow, Rate: 10, Period: time.Minute},
		{Kind: algo.SlidingWindow, Rate: 10, Period: time.Minute},
		{Kind: algo.TokenBucket, Rate: 10, Period: time.Minute},
	} {
		s, err := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		take := func(cost int64) algo.Decision {
			d := make([]algo.Decision, 1)
			if err := s.Take(ctx, []algo.Hit{{Key: "k", Limit: l, Cost: cost}}, d); err != nil {
				t.Fatal(err)
			}
			return d[0]
		}
		g, err := s.Lease(ctx, algo.LeaseRequest{Key: "k", Limit: l, Subscriber: 1, Want: 7, Stale: 1e6})
		if err != nil || g.Granted != 7 {
			t.Fatalf("%v: lease of 7: granted %d, %v", l.Kind, g.Granted, err)
		}
		if d := take(0); d.Remaining != 3 {
			t.Fatalf("%v: a check after leasing 7 of 10 reports %d remaining, want 3", l.Kind, d.Remaining)
		}
		if d := take(4); d.Allowed {
			t.Fatalf("%v: 4 exact hits admitted after leasing 7 of 10", l.Kind)
		}
		if d := take(2); !d.Allowed {
			t.Fatalf("%v: 2 exact hits denied with 3 left", l.Kind)
		}
		g, _ = s.Lease(ctx, algo.LeaseRequest{Key: "k", Limit: l, Subscriber: 1, Want: 5, Stale: 1e6})
		if g.Granted != 1 || g.Remaining != 0 {
			t.Fatalf("%v: lease of 5 after 7 leased and 2 taken: granted %d remaining %d, want 1 and 0", l.Kind, g.Granted, g.Remaining)
		}
		ws, _ := algo.WindowBoundsUs(l, now.UnixMicro())
		g, _ = s.Lease(ctx, algo.LeaseRequest{Key: "k", Limit: l, Subscriber: 1, Return: 6, ReturnWindow: ws, Stale: 1e6})
		if g.Granted != 0 || g.Remaining != 6 {
			t.Fatalf("%v: returning 6: granted %d remaining %d, want 0 and 6", l.Kind, g.Granted, g.Remaining)
		}
		if d := take(6); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%v: 6 exact hits after 6 returned: allowed %v remaining %d, want allowed and 0", l.Kind, d.Allowed, d.Remaining)
		}
		if n := s.Len(); n != 1 {
			t.Fatalf("%v: %d keys stored, want the one the lease and the hits share", l.Kind, n)
		}
		_ = s.Close()
	}
}

// Leases and exact hits on one key from many goroutines: together they
// never admit more than the limit, and admit all of it.
func TestLeaseAndTakeConcurrent(t *testing.T) {
	now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 500, Period: time.Minute}
	s, err := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := make([]algo.Decision, 1)
			for range 40 {
				if i%2 == 0 {
					g, err := s.Lease(ctx, algo.LeaseRequest{Key: "k", Limit: l, Subscriber: int64(1 + i), Want: 3, Stale: 1e6})
					if err != nil {
						t.Error(err)
						return
					}
					admitted.Add(g.Granted)
					continue
				}
				if err := s.Take(ctx, []algo.Hit{{Key: "k", Limit: l, Cost: 1}}, d); err != nil {
					t.Error(err)
					return
				}
				if d[0].Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	// asked: 16·40·3 leased + 16·40 exact = 2560 units for a limit of 500
	if n := admitted.Load(); n != l.Rate {
		t.Fatalf("leases and exact hits admitted %d units together, want the limit %d", n, l.Rate)
	}
}

// A lease that needs a new key takes a slot as Take does: within MaxKeys,
// dropping an expired key for it, and on a full store with no key expired
// it is charged on its window's sketch, which the exact hits of the key
// then see.
func TestLeaseFullStore(t *testing.T) {
	now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	ctx := context.Background()
	s, err := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1, MaxKeys: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	short := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Second}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Minute}
	d := make([]algo.Decision, 1)
	if err := s.Take(ctx, []algo.Hit{{Key: "a", Limit: short, Cost: 1}}, d); err != nil {
		t.Fatal(err)
	}
	if g, _ := s.Lease(ctx, algo.LeaseRequest{Key: "b", Limit: l, Subscriber: 1, Want: 4, Stale: 1e6}); g.Granted != 4 {
		t.Fatalf("lease on a store with a free slot granted %d, want 4", g.Granted)
	}
	if s.Len() != 2 {
		t.Fatalf("%d keys stored, want 2", s.Len())
	}
	now = now.Add(2 * time.Second) // "a" expires
	if g, _ := s.Lease(ctx, algo.LeaseRequest{Key: "c", Limit: l, Subscriber: 1, Want: 4, Stale: 1e6}); g.Granted != 4 {
		t.Fatalf("lease on a full store with an expired key granted %d, want 4", g.Granted)
	}
	if s.Len() != 2 {
		t.Fatalf("%d keys stored after the expired key made room, want 2", s.Len())
	}
	if g, _ := s.Lease(ctx, algo.LeaseRequest{Key: "d", Limit: l, Subscriber: 1, Want: 4, Stale: 1e6}); g.Granted != 4 {
		t.Fatalf("lease on a full store without an expired key granted %d, want 4 (on the sketch)", g.Granted)
	}
	if sk, _ := s.Approximated(); sk != 1 || s.Len() != 2 {
		t.Fatalf("sketched %d, %d keys stored; want 1 and 2", sk, s.Len())
	}
	if err := s.Take(ctx, []algo.Hit{{Key: "d", Limit: l, Cost: 7}}, d); err != nil {
		t.Fatal(err)
	}
	if d[0].Allowed {
		t.Fatal("7 exact hits on a sketched key admitted after leasing 4 of 10")
	}
}
