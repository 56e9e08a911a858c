package redis_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// healthInterval is the probe period of these tests (1 s in production).
const healthInterval = 100 * time.Millisecond

// newHealthStore returns a Store on addrs/url with the probe every
// healthInterval and a timeout generous enough for a loaded -race host.
func newHealthStore(t *testing.T, o redis.Options) *redis.Store {
	t.Helper()
	o.Timeout = 50 * time.Millisecond
	o.HealthInterval = healthInterval
	s, err := redis.New(o)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// pingCalls is the server's cmdstat_ping calls (since the last CONFIG
// RESETSTAT).
func pingCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	v, err := srv.Do(context.Background(), "INFO", "commandstats")
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	for line := range strings.SplitSeq(v.(string), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_ping:calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		if err != nil {
			t.Fatalf("cmdstat_ping %q: %v", line, err)
		}
		return n
	}
	return 0
}

func resetStats(t *testing.T, srv *redistest.Server) {
	t.Helper()
	if _, err := srv.Do(context.Background(), "CONFIG", "RESETSTAT"); err != nil {
		t.Fatalf("CONFIG RESETSTAT: %v", err)
	}
}

// waitState polls s until Healthy() == healthy and BreakerState() is one of
// states, or fails after limit. It returns how long that took.
func waitState(t *testing.T, s *redis.Store, healthy bool, limit time.Duration, states ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		st := s.BreakerState()
		if s.Healthy() == healthy {
			for _, want := range states {
				if st == want {
					return time.Since(start)
				}
			}
		}
		if time.Since(start) > limit {
			t.Fatalf("after %v: Healthy() = %v, BreakerState() = %q; want %v, one of %q",
				limit, s.Healthy(), st, healthy, states)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestHealthProbeWithoutTraffic: with no request at all, the health and the
// breaker state follow Redis going away (killed or frozen) and coming
// back, within a few probe intervals.
func TestHealthProbeWithoutTraffic(t *testing.T) {
	redistest.Require(t)
	for _, tc := range []struct {
		name          string
		fail, restore func(*redistest.Server)
	}{
		{"killed", (*redistest.Server).Kill, (*redistest.Server).Restart},
		{"frozen", (*redistest.Server).Stop, (*redistest.Server).Cont},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			o := redis.DefaultOptions()
			o.URL = srv.URL()
			s := newHealthStore(t, o)

			// Idle and healthy: the probe PINGs and the circuit stays closed.
			resetStats(t, srv)
			time.Sleep(3*healthInterval + healthInterval/2)
			if n := pingCalls(t, srv); n < 2 {
				t.Fatalf("idle for 3.5 intervals: %d PINGs, want >= 2", n)
			}
			if !s.Healthy() || s.BreakerState() != "closed" {
				t.Fatalf("idle, Redis up: Healthy() = %v, BreakerState() = %q", s.Healthy(), s.BreakerState())
			}

			tc.fail(srv)
			// Unhealthy once a probe failed: within an interval plus one
			// probe (at most 250 ms when frozen), plus slack.
			unhealthy := waitState(t, s, false, 10*healthInterval, "closed", "open", "half_open")
			// The circuit opens after Failures failed probes in a row
			// (each up to 250 ms when frozen) spanning FailFor, plus slack.
			detect := waitState(t, s, false, 10*healthInterval+3*time.Second, "open")
			t.Logf("%s: unhealthy %v and circuit open %v after the fault, no traffic", tc.name, unhealthy, detect)
			// It stays unhealthy while Redis is away (open, then half-open
			// probes that fail and reopen it).
			for end := time.Now().Add(5 * healthInterval); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				if s.Healthy() || s.BreakerState() == "closed" {
					t.Fatalf("Redis %s: Healthy() = %v, BreakerState() = %q", tc.name, s.Healthy(), s.BreakerState())
				}
			}

			tc.restore(srv)
			// Within OpenFor + an interval, plus go-redis' 1 s redial once
			// PoolSize dials failed, plus slack.
			rec := waitState(t, s, true, 2*time.Second+10*healthInterval, "closed")
			t.Logf("%s: circuit closed %v after Redis answers again, no traffic", tc.name, rec)

			// And serves requests again.
			lim := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if _, err := s.Take(ctx, []algo.Hit{{Key: "health:" + tc.name, Limit: lim, Cost: 1}}); err != nil {
				t.Fatalf("Take after recovery: %v", err)
			}
		})
	}
}

// TestHealthProbeQuietUnderTraffic: while calls succeed at least once per
// interval the probe sends no PING; once they stop, it does.
func TestHealthProbeQuietUnderTraffic(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	s := newHealthStore(t, o)
	lim := algo.Limit{Kind: algo.TokenBucket, Rate: 1000, Period: time.Second}
	take := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := s.Take(ctx, []algo.Hit{{Key: "health:traffic", Limit: lim, Cost: 1}}); err != nil {
			t.Fatalf("Take: %v", err)
		}
	}
	take()
	resetStats(t, srv)
	for end := time.Now().Add(8 * healthInterval); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		take()
	}
	if n := pingCalls(t, srv); n != 0 {
		t.Fatalf("steady traffic for 8 intervals: %d PINGs, want 0", n)
	}
	// Idle: the probe takes over.
	time.Sleep(3*healthInterval + healthInterval/2)
	if n := pingCalls(t, srv); n < 2 {
		t.Fatalf("idle for 3.5 intervals after traffic: %d PINGs, want >= 2", n)
	}
}

// TestHealthProbeDisabled: HealthInterval 0 sends no PING, and a negative
// interval is invalid.
func TestHealthProbeDisabled(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.HealthInterval = -time.Second
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "health interval") {
		t.Fatalf("Validate(HealthInterval -1s) = %v, want a health interval error", err)
	}
	o.HealthInterval = 0
	s, err := redis.New(o)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	defer func() { _ = s.Close() }()
	resetStats(t, srv)
	time.Sleep(300 * time.Millisecond)
	if n := pingCalls(t, srv); n != 0 {
		t.Fatalf("HealthInterval 0: %d PINGs, want 0", n)
	}
}

// TestHealthProbeCluster: an idle Cluster Store PINGs every master; one
// master killed makes it unhealthy, and healthy again once it is back.
func TestHealthProbeCluster(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	o := redis.DefaultOptions()
	o.URL = ""
	o.Mode = redis.Cluster
	o.Addrs = g.Addrs()
	s := newHealthStore(t, o)
	for _, n := range g.Nodes {
		resetStats(t, n)
	}
	time.Sleep(3*healthInterval + healthInterval/2)
	for _, n := range g.Nodes {
		if c := pingCalls(t, n); c < 2 {
			t.Fatalf("idle for 3.5 intervals: master %s got %d PINGs, want >= 2", n.Addr(), c)
		}
	}
	if !s.Healthy() {
		t.Fatalf("idle, cluster up: Healthy() = false, BreakerState() = %q", s.BreakerState())
	}
	victim := g.Nodes[1]
	victim.Kill()
	detect := waitState(t, s, false, 10*healthInterval, "open")
	t.Logf("cluster: circuit open %v after a master was killed, no traffic", detect)
	victim.Restart()
	back := time.Now()
	g.WaitOK()
	ok := time.Since(back)
	waitState(t, s, true, 2*time.Second+10*healthInterval, "closed")
	t.Logf("cluster: circuit closed %v after the master answers again (cluster_state:ok after %v), no traffic",
		time.Since(back), ok)
}

// TestHealthRefusedConfiguration: a server that refuses the Store's
// configuration (a database index it does not have, a wrong password)
// answers fast, so the circuit stays closed, but the Store is not healthy:
// with traffic and, through the probe, without; and healthy again once the
// server accepts the configuration.
func TestHealthRefusedConfiguration(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	hit := []algo.Hit{{Key: "refused", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Minute}, Cost: 1}}

	t.Run("db index", func(t *testing.T) {
		srv := redistest.Standalone(t)
		o := redis.DefaultOptions()
		o.URL = strings.TrimSuffix(srv.URL(), "/0") + "/99" // redis-server has 16 databases
		s := newHealthStore(t, o)
		_, err := s.Take(ctx, hit)
		if redis.CauseOf(err) != redis.CauseAuth {
			t.Fatalf("Take on db 99: %v (cause %q), want cause auth", err, redis.CauseOf(err))
		}
		waitState(t, s, false, 10*healthInterval, "closed")
		// The probe alone keeps it so (no more traffic).
		time.Sleep(3 * healthInterval)
		waitState(t, s, false, 0, "closed")
		// (redis-server cannot gain databases at runtime; recovery is
		// checked with the password below.)
	})

	t.Run("password", func(t *testing.T) {
		srv := redistest.Standalone(t, redistest.WithACLUser("alice", "right"))
		o := redis.DefaultOptions()
		o.URL = srv.URL()
		o.Username, o.Password = "alice", "wrong"
		s := newHealthStore(t, o)
		// Without traffic: the probe's PING is refused.
		waitState(t, s, false, 20*healthInterval, "closed")
		if _, err := s.Take(ctx, hit); redis.CauseOf(err) != redis.CauseAuth {
			t.Fatalf("Take with a wrong password: %v (cause %q), want cause auth", err, redis.CauseOf(err))
		}
		// The operator fixes the ACL: the next PING (or call) succeeds.
		if _, err := srv.Do(ctx, "ACL", "SETUSER", "alice", "resetpass", ">wrong"); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
		waitState(t, s, true, 30*healthInterval, "closed")
		if _, err := s.Take(ctx, hit); err != nil {
			t.Fatalf("Take after the ACL fix: %v", err)
		}
	})
}
