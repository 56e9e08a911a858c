package redis_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// recoveryWithin is how soon after Redis is back (restarted, thawed,
// memory freed) the Store must be Healthy again without any traffic: the
// probe looks every 100 ms while unhealthy, the circuit half-opens after
// 250 ms.
const recoveryWithin = time.Second

// defaultStore is a Store with DefaultOptions on srv, closed at the end of
// the test.
func defaultStore(t *testing.T, srv *redistest.Server) *redis.Store {
	t.Helper()
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// waitHealthy polls s.Healthy for up to within and returns how long it
// took, failing the test when it did not happen.
func waitHealthy(t *testing.T, s *redis.Store, want bool, within time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for s.Healthy() != want {
		if time.Since(start) > within {
			t.Fatalf("%s: Healthy still %v after %v (circuit %s)", what, !want, within, s.BreakerState())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// countedTwice checks that decisions are counted: on a fresh key with a
// limit of 1, the first Take is allowed and the second denied.
func countedTwice(t *testing.T, s *redis.Store, key string) {
	t.Helper()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	for i, want := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		d, err := s.Take(ctx, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
		cancel()
		if err != nil {
			t.Fatalf("%s: Take %d with an Envoy-like 20 ms deadline: %v (cause %q)", key, i, err, redis.CauseOf(err))
		}
		if d[0].Allowed != want {
			t.Fatalf("%s: Take %d allowed %v, want %v", key, i, d[0].Allowed, want)
		}
	}
}

// failWithTraffic makes a few Takes that must fail (Redis down or frozen)
// so that the circuit sees the failure, then waits until the Store says
// unhealthy.
func failWithTraffic(t *testing.T, s *redis.Store, what string) {
	t.Helper()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := s.Take(ctx, []algo.Hit{{Key: "fail" + strconv.Itoa(i), Limit: l, Cost: 1}})
		cancel()
		if err == nil {
			t.Fatalf("%s: a Take succeeded", what)
		}
	}
	waitHealthy(t, s, false, 2*time.Second, what)
}

// TestRecoveryWithoutTraffic: after Redis is killed and restarted on the
// same port, or frozen and thawed, with traffic seeing the failure and
// then 3 s of silence, the Store is Healthy again within recoveryWithin
// of Redis' return with no request at all, and the next decisions (with
// Envoy's 20 ms deadline) are counted.
func TestRecoveryWithoutTraffic(t *testing.T) {
	redistest.Require(t)
	for _, fault := range []string{"restart", "freeze"} {
		t.Run(fault, func(t *testing.T) {
			srv := redistest.Standalone(t)
			s := defaultStore(t, srv)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Warm(ctx); err != nil {
				t.Fatal(err)
			}
			countedTwice(t, s, "before")
			switch fault {
			case "restart":
				srv.Kill()
			case "freeze":
				srv.Stop()
				t.Cleanup(func() {
					if srv.Alive() {
						srv.Cont()
					}
				})
			}
			failWithTraffic(t, s, fault)
			time.Sleep(3 * time.Second) // silence: no traffic at all
			if s.Healthy() {
				t.Fatal("Healthy while Redis is still down")
			}
			switch fault {
			case "restart":
				srv.Restart()
			case "freeze":
				srv.Cont()
			}
			took := waitHealthy(t, s, true, recoveryWithin, fault+": back, no traffic")
			t.Logf("%s: Healthy %v after Redis was back, without traffic", fault, took.Round(time.Millisecond))
			countedTwice(t, s, "after")
		})
	}
}

// TestHealthyOnlyWhenCounting: a fresh Store is not Healthy before Warm
// (nothing dialed, script not loaded) and is after it; while Redis refuses
// writes (OOM under maxmemory) it is not Healthy although PING answers,
// and once maxmemory is lifted it is Healthy again within recoveryWithin
// without traffic (the probe's write probe); an OOM that starts while no
// request comes is found by the idle probe's write within two intervals.
func TestHealthyOnlyWhenCounting(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	s := defaultStore(t, srv)
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
	for i := range 200 {
		if err := ctl.Set(ctx, "fill"+strconv.Itoa(i), string(make([]byte, 4096)), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	used, err := ctl.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	mem := redistest.InfoInt(t, used, "used_memory")
	if err := ctl.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := ctl.ConfigSet(ctx, "maxmemory", strconv.FormatInt(mem-1<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Hour}
	_, err = s.Take(ctx, []algo.Hit{{Key: "oom", Limit: l, Cost: 1}})
	if redis.CauseOf(err) != redis.CauseOOM {
		t.Fatalf("Take under OOM: %v, want cause oom", err)
	}
	if s.Healthy() {
		t.Fatal("Healthy while Redis refuses every write with OOM")
	}
	time.Sleep(1500 * time.Millisecond) // PINGs answer meanwhile
	if s.Healthy() {
		t.Fatal("Healthy again under OOM after the probe's PINGs: a PING does not prove writes count")
	}
	if err := ctl.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	took := waitHealthy(t, s, true, recoveryWithin, "maxmemory lifted, no traffic")
	t.Logf("OOM: Healthy %v after maxmemory was lifted, without traffic", took.Round(time.Millisecond))
	if st := s.BreakerState(); st != "closed" {
		t.Errorf("circuit %s after OOM: a live server's OOM reply must not open it", st)
	}

	// OOM again, with no traffic at all: the probe's write finds it.
	if err := ctl.ConfigSet(ctx, "maxmemory", strconv.FormatInt(mem-1<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	took = waitHealthy(t, s, false, 2*redis.DefaultHealthInterval+time.Second, "OOM with no traffic")
	t.Logf("OOM without traffic: unhealthy after %v", took.Round(time.Millisecond))
	if err := ctl.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, s, true, recoveryWithin, "maxmemory lifted again, no traffic")
}
