package lease

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// latencyStore is a memory store on a clock shared with the Leaser that
// each Lease advances by the request's latency before the store acts.
type latencyStore struct {
	mu      sync.Mutex
	now     time.Time
	latency time.Duration
	st      *memory.Store
}

func (s *latencyStore) Now() time.Time { s.mu.Lock(); defer s.mu.Unlock(); return s.now }

func (s *latencyStore) set(t time.Time, latency time.Duration) {
	s.mu.Lock()
	s.now, s.latency = t, latency
	s.mu.Unlock()
}

func (s *latencyStore) Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	s.mu.Lock()
	s.now = s.now.Add(s.latency)
	s.mu.Unlock()
	return s.st.Lease(ctx, req)
}

// A key's first hit just before a window boundary is admitted: the
// Leaser's estimate of the store's clock runs ahead of it by up to a
// request's latency, so it may place the hit in the next window while the
// store still grants from the current one; the hit then waits for the
// store to reach that window rather than being denied, and a decision's
// reset is never more than a window away.
func TestFirstHitAtWindowBoundary(t *testing.T) {
	w0 := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	ls0 := &latencyStore{now: w0.Add(500 * time.Millisecond), latency: 5 * time.Millisecond}
	st, err := memory.New(memory.Options{Now: ls0.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	ls0.st = st
	ls, err := New(Options{Store: ls0, Subscriber: 1, Interval: time.Hour, Now: ls0.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ls.Close(context.Background()) }()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A first key sets the clock offset estimate to the 5 ms latency.
	if d, failed, _, _ := ls.Take(ctx, []algo.Hit{{Key: "a", Limit: l, Cost: 1}}); len(failed) > 0 || !d[0].Allowed {
		t.Fatalf("first key mid-window: %+v failed %v", d, failed)
	}
	// New keys 3 ms before the boundary, replies 1 ms after the send:
	// the estimate places the hit 2 ms into the next window, the store
	// is 2 ms before it.
	w1 := w0.Add(time.Second)
	for i, before := range []time.Duration{3, 2, 1} {
		ls0.set(w1.Add(-before*time.Millisecond), time.Millisecond)
		d, failed, _, _ := ls.Take(ctx, []algo.Hit{{Key: "b" + string(rune('0'+i)), Limit: l, Cost: 1}})
		if len(failed) > 0 {
			t.Fatalf("%v before the boundary: failed", before*time.Millisecond)
		}
		if !d[0].Allowed {
			t.Errorf("first hit %v before the boundary denied (reset %v, retry %v)", before*time.Millisecond, d[0].ResetAfter, d[0].RetryAfter)
		}
		if d[0].ResetAfter > l.Period || d[0].RetryAfter > l.Period {
			t.Errorf("%v before the boundary: reset %v, retry %v: beyond a window", before*time.Millisecond, d[0].ResetAfter, d[0].RetryAfter)
		}
	}
}
