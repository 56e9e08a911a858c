package lease

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// gatedStore is a memory store whose Lease calls wait for open while
// armed, and report each call's end on ended.
type gatedStore struct {
	st    *memory.Store
	armed chan struct{} // closed: calls wait for open
	open  chan struct{}
	ended chan struct{}
}

func (s *gatedStore) Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	select {
	case <-s.armed:
		<-s.open
	default:
	}
	defer func() { s.ended <- struct{}{} }()
	return s.st.Lease(ctx, req)
}

// remaining is what the store has left on key for limit l, read with a
// lease of nothing by another subscriber.
func remaining(t *testing.T, st *memory.Store, key string, l algo.Limit) int64 {
	t.Helper()
	g, err := st.Lease(context.Background(), algo.LeaseRequest{Key: key, Limit: l, Subscriber: 99})
	if err != nil {
		t.Fatal(err)
	}
	return g.Remaining
}

// A renewal in flight when the Leaser closes gives its grant back: Close
// waits for it while its context allows, and a renewal that ends after
// that gives its units back itself. Either way the store ends with
// nothing charged to the closed Leaser.
func TestCloseReturnsRenewalInFlight(t *testing.T) {
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	for _, tc := range []struct {
		name    string
		waitFor time.Duration // Close's context
	}{
		{"close waits", time.Minute},
		{"close gives up", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := memory.New(memory.Options{SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = st.Close() }()
			gs := &gatedStore{st: st, armed: make(chan struct{}), open: make(chan struct{}), ended: make(chan struct{}, 16)}
			close(gs.armed)
			ls, err := New(Options{Store: gs, Subscriber: 1, Interval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			// The first hit starts the key's lease, which waits at the
			// gate; the hit gives up at its deadline.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			_, _, _, _ = ls.Take(ctx, []algo.Hit{{Key: "k", Limit: l, Cost: 1}})
			cancel()
			cctx, ccancel := context.WithTimeout(context.Background(), tc.waitFor)
			defer ccancel()
			closed := make(chan struct{})
			go func() { _ = ls.Close(cctx); close(closed) }()
			if tc.waitFor == 0 {
				<-closed
			}
			close(gs.open)
			<-gs.ended // the renewal's grant
			<-closed
			// The grant goes back in a second Lease call: by Close
			// itself, or by the renewal once it saw Close.
			select {
			case <-gs.ended:
			case <-time.After(30 * time.Second):
				t.Fatal("the renewal's grant was not given back")
			}
			if got := remaining(t, st, "k", l); got != l.Rate {
				t.Errorf("store has %d of %d left after Close: the closed Leaser still holds units", got, l.Rate)
			}
		})
	}
}
