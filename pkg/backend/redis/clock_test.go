package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestStoreClockDrivesBreaker: the circuit breaker reads the Store's
// clock, the one its health probe runs on: once the probe has opened the
// circuit, moving that clock by OpenFor makes the circuit half-open at
// once, though no real time of that length passed.
func TestStoreClockDrivesBreaker(t *testing.T) {
	srv, o := standaloneOptions(t)
	o.Breaker.OpenFor = time.Hour
	s, clk := newHealthStore(t, o)
	idleTicks(t, s, clk, 1) // warm
	srv.Kill()
	t.Cleanup(func() {
		if !srv.Alive() {
			srv.Restart()
		}
	})
	driveUntil(t, s, clk, false, "open")
	clk.Advance(time.Hour)
	if st := s.BreakerState(); st != "half_open" {
		t.Fatalf("OpenFor (1 h) passed on the Store's clock: BreakerState() = %q, want half_open", st)
	}
}

// TestStoreClockDrivesBudgets: a call's budget and the stall evidence run
// on the Store's clock: a call without a deadline held by Redis (CLIENT
// PAUSE) completes with its budget's error once the clock has moved by
// MaxWait (1 h), long before that much real time. FailFor is as long, so
// that only the clock can establish the stall.
func TestStoreClockDrivesBudgets(t *testing.T) {
	srv, o := standaloneOptions(t)
	o.MaxWait = time.Hour
	o.Breaker.FailFor = time.Hour
	s, clk := newHealthStore(t, o)
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 30, Period: time.Hour}
	if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "clock:warm", Limit: l, Cost: 1}}); err != nil {
		t.Fatalf("Take: %v", err)
	}
	ctl := srv.Client()
	defer func() { _ = ctl.Close() }()
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ctl.Do(ctx, "CLIENT", "UNPAUSE").Err() }()
	held := make(chan error, 1)
	go func() {
		_, err := algotest.Take(ctx, s, []algo.Hit{{Key: "clock:held", Limit: l, Cost: 1}})
		held <- err
	}()
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
		time.Sleep(time.Millisecond) // Redis reading the script: a real process
	}
	clk.Advance(time.Hour)
	select {
	case err := <-held:
		if c := redis.CauseOf(err); c != redis.CauseStalled && c != redis.CauseTimeout {
			t.Fatalf("held call after MaxWait on the Store's clock: %v (cause %q), want cause stalled or timeout", err, c)
		}
	case <-time.After(stateWithin):
		t.Fatalf("held call not answered %v after MaxWait (1 h) passed on the Store's clock", stateWithin)
	}
}
