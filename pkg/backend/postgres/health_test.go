package postgres_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// TestCallerDeadlineKeepsHealthy: two stores on one PostgreSQL, 16
// callers each with 20 ms deadlines on one hot key, every batch held
// past those deadlines before its COMMIT (so each runs out of its
// callers' budget in flight). The callers' deadlines running out says
// nothing of PostgreSQL: Healthy never turns false and the breaker stays
// closed, while the callers get context.DeadlineExceeded (or a timeout,
// not sent, when they ran out queued behind the batch).
func TestCallerDeadlineKeepsHealthy(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	edit := func(o *postgres.Options) { o.Timeout = 100 * time.Millisecond }
	stores := []*postgres.Store{newStore(t, srv, db, edit), newStore(t, srv, db, edit)}
	for _, s := range stores {
		s.SetBeforeCommit(func() { time.Sleep(30 * time.Millisecond) })
	}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 40, Period: time.Hour}
	key := "hot/health/" + strconv.FormatInt(time.Now().UnixNano(), 36)

	var flips atomic.Int64
	stop := make(chan struct{})
	var watch sync.WaitGroup
	for _, s := range stores {
		watch.Go(func() {
			was := true
			for {
				select {
				case <-stop:
					return
				default:
				}
				up := s.Healthy() && s.BreakerState() == "closed"
				if was && !up {
					flips.Add(1)
				}
				was = up
				time.Sleep(time.Millisecond)
			}
		})
	}
	var deadline, queued atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stores {
		for range 16 {
			wg.Go(func() {
				for range 10 {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					out := make([]algo.Decision, 1)
					err := s.Take(ctx, []algo.Hit{{Key: key, Limit: l, Cost: 1}}, out)
					cancel()
					switch {
					case errors.Is(err, context.DeadlineExceeded):
						deadline.Add(1)
					case causeOf(err) == postgres.CauseTimeout:
						queued.Add(1) // ran out waiting behind the key's batch
					case err != nil:
						t.Errorf("take: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	watch.Wait()
	if deadline.Load() == 0 {
		t.Fatalf("no call ran out of its 20 ms deadline with every COMMIT held 30 ms")
	}
	if n := flips.Load(); n != 0 {
		t.Errorf("health turned false %d times while PostgreSQL answered (%d calls ran out of their deadline)", n, deadline.Load())
	}
	for _, s := range stores {
		if !s.Healthy() {
			c, err := s.HealthCause()
			t.Errorf("store unhealthy after the run: cause %s, error %v", c, err)
		}
	}
}

// TestProbeTimeoutIsNoOutage: one health probe that runs out of time (a
// frozen PostgreSQL standing in for a CPU-starved host) leaves an idle
// Store healthy: it counts as one stall toward the breaker, not an
// outage. Probes that keep timing out open the breaker, so an idle Store
// on a silent PostgreSQL still turns unhealthy, with cause timeout.
func TestProbeTimeoutIsNoOutage(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	s, clk := newStoreOnClock(t, srv, db, func(o *postgres.Options) { o.Timeout = 100 * time.Millisecond })
	warm(t, s, algo.Hit{Key: "probe", Limit: longWindow, Cost: 1})
	srv.Stop()
	defer srv.Cont()
	clk.Tick(t) // one probe, which times out
	if !s.Healthy() {
		c, err := s.HealthCause()
		t.Fatalf("unhealthy after one probe timed out: cause %s, error %v", c, err)
	}
	probes := 1
	for s.Healthy() {
		if probes == 40 {
			t.Fatalf("still healthy after %d probes timed out (circuit %s)", probes, s.BreakerState())
		}
		clk.Tick(t)
		probes++
	}
	c, err := s.HealthCause()
	if c != postgres.CauseTimeout || err == nil {
		t.Errorf("HealthCause after the breaker opened: %q, %v; want %s", c, err, postgres.CauseTimeout)
	}
	t.Logf("unhealthy after %d probes timed out", probes)
	srv.Cont()
	tickHealthy(t, s, clk)
}
