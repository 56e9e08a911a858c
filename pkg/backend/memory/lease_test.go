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
