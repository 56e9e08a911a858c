package redis_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// healthInterval is the probe period of these tests (the production
// default). The Store runs on a clock.Manual: each Tick is one iteration
// of the probe's loop and moves the breaker's clock with it, so what the
// probe does per interval is counted, not timed.
const healthInterval = redis.DefaultHealthInterval

// stateWithin bounds, in real time, how long a test drives the probe
// until a state it waits for: generous, so that scheduling delay cannot
// fail it while a Store that never gets there does.
const stateWithin = 20 * time.Second

// newHealthStore returns a Store on o with a timeout generous enough for
// a -race build, on a clock.Manual, with its health probe every
// healthInterval.
func newHealthStore(t *testing.T, o redis.Options) (*redis.Store, *clock.Manual) {
	t.Helper()
	o.Timeout = 50 * time.Millisecond
	o.HealthInterval = healthInterval
	clk := clock.NewManual()
	s, err := redis.NewOnClock(o, clk)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, clk
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

// inState reports whether s.Healthy() == healthy and s.BreakerState() is
// one of states.
func inState(s *redis.Store, healthy bool, states ...string) bool {
	return s.Healthy() == healthy && slices.Contains(states, s.BreakerState())
}

// driveUntil runs probe iterations (clk.Tick) until s is in the state
// (inState), failing after stateWithin of real time; each Tick moves the
// breaker's clock (OpenFor, FailFor) on with the probe's. Every iteration that leaves s unhealthy must arm the
// next one at most RecoveryPoll later: the probe looks again soon, so that
// a Redis that came back is counted again within a second. It returns the
// number of iterations.
func driveUntil(t *testing.T, s *redis.Store, clk *clock.Manual, healthy bool, states ...string) int {
	t.Helper()
	end := time.Now().Add(stateWithin)
	for n := 0; ; n++ {
		if inState(s, healthy, states...) {
			return n
		}
		if time.Now().After(end) {
			t.Fatalf("after %d probe iterations (%v): Healthy() = %v, BreakerState() = %q; want %v, one of %q",
				n, stateWithin, s.Healthy(), s.BreakerState(), healthy, states)
		}
		next := clk.Tick(t)
		if !s.Healthy() && next > redis.RecoveryPoll {
			t.Fatalf("unhealthy (circuit %s): next probe in %v, want <= %v", s.BreakerState(), next, redis.RecoveryPoll)
		}
	}
}

// idleTicks runs n probe iterations with Redis up and no traffic: each
// arms the next one interval later, and the Store stays healthy.
func idleTicks(t *testing.T, s *redis.Store, clk *clock.Manual, n int) {
	t.Helper()
	for i := range n {
		if next := clk.Tick(t); next != healthInterval {
			t.Fatalf("idle iteration %d: next probe in %v, want the interval %v (Healthy %v, circuit %s)",
				i, next, healthInterval, s.Healthy(), s.BreakerState())
		}
		if !s.Healthy() || s.BreakerState() != "closed" {
			t.Fatalf("idle iteration %d, Redis up: Healthy() = %v, BreakerState() = %q", i, s.Healthy(), s.BreakerState())
		}
	}
}

// TestHealthProbeWithoutTraffic: with no request at all, the health and the
// breaker state follow Redis going away (killed or frozen) and coming
// back: the first probe after a kill makes the Store unhealthy (a refused
// connection proves the outage), a frozen Redis makes it unhealthy when
// the probes' timeouts open the circuit (silence proves nothing until it
// has lasted FailFor), further probes keep the circuit from closing while
// Redis is away, and once Redis answers again the probes close it.
func TestHealthProbeWithoutTraffic(t *testing.T) {
	redistest.Require(t)
	for _, tc := range []struct {
		name          string
		fail, restore func(*redistest.Server)
		proven        bool // the first failed probe proves the outage
	}{
		{"killed", (*redistest.Server).Kill, (*redistest.Server).Restart, true},
		{"frozen", (*redistest.Server).Stop, (*redistest.Server).Cont, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			o := redis.DefaultOptions()
			o.URL = srv.URL()
			s, clk := newHealthStore(t, o)

			// The first iteration warms; idle and healthy afterwards, every
			// iteration PINGs and the circuit stays closed.
			idleTicks(t, s, clk, 1)
			resetStats(t, srv)
			idleTicks(t, s, clk, 3)
			if n := pingCalls(t, srv); n < 3 {
				t.Fatalf("3 idle probe iterations: %d PINGs, want >= 3", n)
			}

			tc.fail(srv)
			t.Cleanup(func() {
				if srv.Alive() {
					srv.Cont()
				}
			})
			// Unhealthy after the first probe that fails when it proves
			// the outage; else still healthy, with the circuit closed.
			clk.Tick(t)
			if s.Healthy() == tc.proven || s.BreakerState() != "closed" {
				t.Fatalf("Redis %s, one failed probe: Healthy() = %v, BreakerState() = %q; want healthy %v, closed",
					tc.name, s.Healthy(), s.BreakerState(), !tc.proven)
			}
			// The circuit opens after Failures failed probes in a row
			// (timeouts: spanning FailFor).
			n := driveUntil(t, s, clk, false, "open")
			t.Logf("%s: circuit open %d probe iterations after the first failed one, no traffic", tc.name, n)
			// It stays unhealthy while Redis is away (open, then half-open
			// probes that fail and reopen it).
			for i := range 10 {
				clk.Tick(t)
				if s.Healthy() || s.BreakerState() == "closed" {
					t.Fatalf("Redis %s, iteration %d: Healthy() = %v, BreakerState() = %q", tc.name, i, s.Healthy(), s.BreakerState())
				}
			}

			tc.restore(srv)
			n = driveUntil(t, s, clk, true, "closed")
			t.Logf("%s: circuit closed %d probe iterations after Redis answers again, no traffic", tc.name, n)

			// And serves requests again.
			lim := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "health:" + tc.name, Limit: lim, Cost: 1}}); err != nil {
				t.Fatalf("Take after recovery: %v", err)
			}
		})
	}
}

// silentRounds is how many times TestHealthProbeShortSilence freezes
// Redis for one probe.
const silentRounds = 5

// TestHealthProbeShortSilence: a Redis that is silent for one probe (a
// PING that times out with nothing received, as on a host starved of CPU)
// and then answers again leaves the Store healthy with its circuit closed,
// silentRounds times in a row: a probe's timeout makes the Store
// unhealthy only once the circuit opens, as a request's would, so a short
// stall never takes a pod out of readiness.
func TestHealthProbeShortSilence(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	t.Cleanup(func() {
		if srv.Alive() {
			srv.Cont()
		}
	})
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	s, clk := newHealthStore(t, o)
	idleTicks(t, s, clk, 2)
	flaps := 0
	for round := range silentRounds {
		srv.Stop()
		next := clk.Tick(t) // its PING gets no reply
		silent := s.Healthy()
		state := s.BreakerState()
		srv.Cont()
		if !silent || state != "closed" {
			flaps++
			t.Errorf("round %d: after one silent probe Healthy() = %v, BreakerState() = %q; want healthy, closed", round, silent, state)
		}
		if next > healthInterval {
			t.Fatalf("round %d: after a silent probe the next one in %v, want at most the interval %v", round, next, healthInterval)
		}
		// The next probe is answered: healthy and idle again.
		if clk.Tick(t); !inState(s, true, "closed") {
			t.Fatalf("round %d: Redis answering again: Healthy() = %v, BreakerState() = %q", round, s.Healthy(), s.BreakerState())
		}
	}
	if got := redis.BreakerOpened(s); got != 0 || flaps != 0 {
		t.Fatalf("%d rounds of one silent probe: %d health flaps, circuit opened %d times; want none", silentRounds, flaps, got)
	}
}

// TestHealthProbeQuietUnderTraffic: while a call succeeds within every
// interval the probe sends no PING; once calls stop, every iteration does.
func TestHealthProbeQuietUnderTraffic(t *testing.T) {
	srv, o := standaloneOptions(t)
	s, clk := newHealthStore(t, o)
	lim := algo.Limit{Kind: algo.TokenBucket, Rate: 1000, Period: time.Second}
	take := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "health:traffic", Limit: lim, Cost: 1}}); err != nil {
			t.Fatalf("Take: %v", err)
		}
	}
	idleTicks(t, s, clk, 1) // warm
	take()
	resetStats(t, srv)
	for range 8 {
		clk.Advance(healthInterval / 2)
		take()
		idleTicks(t, s, clk, 1)
	}
	if n := pingCalls(t, srv); n != 0 {
		t.Fatalf("a successful call within each of 8 intervals: %d PINGs, want 0", n)
	}
	// Idle: the probe takes over.
	idleTicks(t, s, clk, 3)
	if n := pingCalls(t, srv); n < 3 {
		t.Fatalf("3 idle probe iterations after traffic: %d PINGs, want >= 3", n)
	}
}

// TestHealthProbeDisabled: HealthInterval 0 starts no probe (no PING),
// and a negative interval is invalid.
func TestHealthProbeDisabled(t *testing.T) {
	srv, o := standaloneOptions(t)
	o.HealthInterval = -time.Second
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "health interval") {
		t.Fatalf("Validate(HealthInterval -1s) = %v, want a health interval error", err)
	}
	o.HealthInterval = 0
	resetStats(t, srv)
	s, err := redis.New(o)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	defer func() { _ = s.Close() }()
	if redis.ProbeRunning(s) {
		t.Fatal("HealthInterval 0: a probe loop is running")
	}
	if n := pingCalls(t, srv); n != 0 {
		t.Fatalf("HealthInterval 0: %d PINGs, want 0", n)
	}
}

// TestHealthProbeCluster: an idle Cluster Store PINGs every master on
// every iteration; one master killed opens the circuit, and it closes
// again once the master is back.
func TestHealthProbeCluster(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	o := redis.DefaultOptions()
	o.URL = ""
	o.Mode = redis.Cluster
	o.Addrs = g.Addrs()
	s, clk := newHealthStore(t, o)
	idleTicks(t, s, clk, 1) // warm
	for _, n := range g.Nodes {
		resetStats(t, n)
	}
	idleTicks(t, s, clk, 3)
	for _, n := range g.Nodes {
		if c := pingCalls(t, n); c < 3 {
			t.Fatalf("3 idle probe iterations: master %s got %d PINGs, want >= 3", n.Addr(), c)
		}
	}
	victim := g.Nodes[1]
	victim.Kill()
	n := driveUntil(t, s, clk, false, "open")
	t.Logf("cluster: circuit open %d probe iterations after a master was killed, no traffic", n)
	victim.Restart()
	g.WaitOK()
	n = driveUntil(t, s, clk, true, "closed")
	t.Logf("cluster: circuit closed %d probe iterations after the master answers again (cluster_state:ok), no traffic", n)
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
		s, clk := newHealthStore(t, o)
		_, err := algotest.Take(ctx, s, hit)
		if redis.CauseOf(err) != redis.CauseAuth {
			t.Fatalf("Take on db 99: %v (cause %q), want cause auth", err, redis.CauseOf(err))
		}
		if !inState(s, false, "closed") {
			t.Fatalf("after a refused Take: Healthy() = %v, BreakerState() = %q; want unhealthy, closed", s.Healthy(), s.BreakerState())
		}
		// The probe alone keeps it so (no more traffic).
		for i := range 3 {
			clk.Tick(t)
			if !inState(s, false, "closed") {
				t.Fatalf("probe iteration %d: Healthy() = %v, BreakerState() = %q; want unhealthy, closed", i, s.Healthy(), s.BreakerState())
			}
		}
		// (redis-server cannot gain databases at runtime; recovery is
		// checked with the password below.)
	})

	t.Run("password", func(t *testing.T) {
		srv := redistest.Standalone(t, redistest.WithACLUser("alice", "right"))
		o := redis.DefaultOptions()
		o.URL = srv.URL()
		o.Username, o.Password = "alice", "wrong"
		s, clk := newHealthStore(t, o)
		// Without traffic: the probe's PING is refused.
		clk.Tick(t)
		if !inState(s, false, "closed") {
			t.Fatalf("after a refused probe: Healthy() = %v, BreakerState() = %q; want unhealthy, closed", s.Healthy(), s.BreakerState())
		}
		if _, err := algotest.Take(ctx, s, hit); redis.CauseOf(err) != redis.CauseAuth {
			t.Fatalf("Take with a wrong password: %v (cause %q), want cause auth", err, redis.CauseOf(err))
		}
		// The operator fixes the ACL: the next PING (or call) succeeds.
		if _, err := srv.Do(ctx, "ACL", "SETUSER", "alice", "resetpass", ">wrong"); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
		driveUntil(t, s, clk, true, "closed")
		if _, err := algotest.Take(ctx, s, hit); err != nil {
			t.Fatalf("Take after the ACL fix: %v", err)
		}
	})
}
