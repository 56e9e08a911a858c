package redis_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// defaultStore is a Store with DefaultOptions on srv, closed at the end of
// the test.
func defaultStore(t testing.TB, srv *redistest.Server) *redis.Store {
	t.Helper()
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	return openStore(t, o)
}

// openStore is redis.New(o), failing t on an error; the Store is closed
// at the end of the test.
func openStore(t testing.TB, o redis.Options) *redis.Store {
	t.Helper()
	s, err := redis.New(o)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// standaloneOptions starts a standalone redis-server (t is skipped
// without one, as redistest.Require does) and returns it with
// DefaultOptions pointing at it.
func standaloneOptions(t *testing.T) (*redistest.Server, redis.Options) {
	t.Helper()
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	return srv, o
}

// waitHealthy polls s.Healthy for up to within and returns how long it
// took, failing the test when it did not happen.
func waitHealthy(t testing.TB, s *redis.Store, want bool, within time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for s.Healthy() != want {
		if time.Since(start) > within {
			t.Fatalf("%s: Healthy still %v after %v (circuit %s)", what, !want, within, s.BreakerState())
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// countedTwice checks that decisions are counted: on a fresh key with a
// limit of 1, the first Take is allowed and the second denied.
func countedTwice(t testing.TB, s *redis.Store, key string) {
	t.Helper()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	for i, want := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
		cancel()
		if err != nil {
			t.Fatalf("%s: Take %d with an Envoy-like 20 ms deadline: %v (cause %q)", key, i, err, redis.CauseOf(err))
		}
		if d[0].Allowed != want {
			t.Fatalf("%s: Take %d allowed %v, want %v", key, i, d[0].Allowed, want)
		}
	}
}

// failWithTraffic makes a few Takes that must fail (failTakes), then
// waits until the Store says unhealthy.
func failWithTraffic(t testing.TB, s *redis.Store, what string) {
	t.Helper()
	failTakes(t, s, what)
	waitHealthy(t, s, false, stateWithin, what)
}

// failTakes makes a few Takes that must fail (Redis down or frozen) so
// that the circuit sees the failure.
func failTakes(t testing.TB, s *redis.Store, what string) {
	t.Helper()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := algotest.Take(ctx, s, []algo.Hit{{Key: "fail" + strconv.Itoa(i), Limit: l, Cost: 1}})
		cancel()
		if err == nil {
			t.Fatalf("%s: a Take succeeded", what)
		}
	}
}

// faultFor is the Store's outage in the recovery tests: Redis killed (and
// restarted on the same port) or frozen (and thawed).
func faultFor(t testing.TB, srv *redistest.Server, fault string) (restore func()) {
	switch fault {
	case "restart":
		srv.Kill()
		return srv.Restart
	default:
		srv.Stop()
		t.Cleanup(func() {
			if srv.Alive() {
				srv.Cont()
			}
		})
		return srv.Cont
	}
}

// TestRecoveryWithoutTraffic: after Redis is killed and restarted on the
// same port, or frozen and thawed, with traffic seeing the failure and
// then silence (30 probe iterations, no request), the probe alone makes
// the Store Healthy again, looking at most RecoveryPoll apart while it is
// not (driveUntil), and the next decisions (with Envoy's 20 ms deadline)
// are counted. How long that takes in real time is
// BenchmarkRecoveryWithoutTraffic's.
func TestRecoveryWithoutTraffic(t *testing.T) {
	redistest.Require(t)
	for _, fault := range []string{"restart", "freeze"} {
		t.Run(fault, func(t *testing.T) {
			srv := redistest.Standalone(t)
			o := redis.DefaultOptions()
			o.URL = srv.URL()
			s, clk := newHealthStore(t, o)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Warm(ctx); err != nil {
				t.Fatal(err)
			}
			countedTwice(t, s, "before")
			restore := faultFor(t, srv, fault)
			failTakes(t, s, fault)
			driveUntil(t, s, clk, false, "closed", "open", "half_open")
			for i := range 30 { // silence: no traffic at all
				if next := clk.Tick(t); next > redis.RecoveryPoll {
					t.Fatalf("%s: silent iteration %d, unhealthy: next probe in %v, want <= %v", fault, i, next, redis.RecoveryPoll)
				}
			}
			if s.Healthy() {
				t.Fatal("Healthy while Redis is still down")
			}
			restore()
			n := driveUntil(t, s, clk, true, "closed")
			t.Logf("%s: Healthy %d probe iterations after Redis was back, without traffic", fault, n)
			countedTwice(t, s, "after")
		})
	}
}

// BenchmarkRecoveryWithoutTraffic measures the promise of
// docs/redis-operations.md ("Recovery"): with the default options (real
// clock), Redis killed and restarted, or frozen and thawed, after traffic
// saw the failure and 3 s of silence, how long until the Store is Healthy
// again with no request at all (ms_to_healthy; the promise: under 1 s).
func BenchmarkRecoveryWithoutTraffic(b *testing.B) {
	redistest.Require(b)
	for _, fault := range []string{"restart", "freeze"} {
		b.Run(fault, func(b *testing.B) {
			var total time.Duration
			for range b.N {
				srv := redistest.Standalone(b)
				s := defaultStore(b, srv)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := s.Warm(ctx); err != nil {
					b.Fatal(err)
				}
				cancel()
				countedTwice(b, s, "before")
				restore := faultFor(b, srv, fault)
				failWithTraffic(b, s, fault)
				time.Sleep(3 * time.Second) // silence: no traffic at all
				restore()
				total += waitHealthy(b, s, true, stateWithin, fault+": back, no traffic")
				countedTwice(b, s, "after")
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms_to_healthy")
		})
	}
}

// TestHealthyOnlyWhenCounting: a fresh Store is not Healthy before Warm
// (nothing dialed, script not loaded) and is after it; while Redis refuses
// writes (OOM under maxmemory) it is not Healthy although PING answers,
// and once maxmemory is lifted the probe alone (its write) makes it
// Healthy again; an OOM that starts while no request comes is found by
// the idle probe's write at its next iteration.
func TestHealthyOnlyWhenCounting(t *testing.T) {
	srv, o := standaloneOptions(t)
	s, clk := newHealthStore(t, o)
	if s.Healthy() {
		t.Fatal("Healthy before Warm: nothing can be counted yet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.Healthy() || !s.Warmed() {
		t.Fatal("not Healthy after Warm")
	}
	// The script is loaded: SCRIPT EXISTS answers 1, so no request pays
	// for EVAL.
	ctl := srv.Client()
	if ex, err := ctl.ScriptExists(ctx, redis.ScriptSHA()).Result(); err != nil || len(ex) != 1 || !ex[0] {
		t.Fatalf("SCRIPT EXISTS after Warm: %v %v", ex, err)
	}

	// OOM: maxmemory below what is used, noeviction.
	redistest.StartOOM(t, srv)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Hour}
	_, err := algotest.Take(ctx, s, []algo.Hit{{Key: "oom", Limit: l, Cost: 1}})
	if redis.CauseOf(err) != redis.CauseOOM {
		t.Fatalf("Take under OOM: %v, want cause oom", err)
	}
	if s.Healthy() {
		t.Fatal("Healthy while Redis refuses every write with OOM")
	}
	for range 3 { // PINGs answer meanwhile
		clk.Tick(t)
		if s.Healthy() {
			t.Fatal("Healthy again under OOM after a probe iteration: a PING does not prove writes count")
		}
	}
	redistest.EndOOM(t, srv)
	n := driveUntil(t, s, clk, true, "closed")
	t.Logf("OOM: Healthy %d probe iterations after maxmemory was lifted, without traffic", n)
	if st := s.BreakerState(); st != "closed" {
		t.Errorf("circuit %s after OOM: a live server's OOM reply must not open it", st)
	}

	// OOM again, with no traffic at all: the probe's write finds it.
	redistest.StartOOM(t, srv)
	clk.Tick(t)
	if s.Healthy() {
		t.Fatal("OOM with no traffic: Healthy after the next probe iteration, want its write refused")
	}
	redistest.EndOOM(t, srv)
	driveUntil(t, s, clk, true, "closed")
}
