package memcache_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
)

// newBreakerStore is a store on srv with the default Timeout (50 ms) and
// no health probe: only the test's calls reach the breaker.
func newBreakerStore(t *testing.T, srv *memcachetest.Server) *memcache.Store {
	t.Helper()
	o := memcache.DefaultOptions()
	o.Addrs = []string{srv.Addr()}
	o.HealthInterval = 0
	s, err := memcache.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// untilRefused calls s until a call is refused by the open circuit with
// want, at most max calls; every call before it must fail with cause
// before. It returns how many calls failed before the refusal.
func untilRefused(t *testing.T, s *memcache.Store, want error, before string, max int) int {
	t.Helper()
	l := fixed(1000, time.Hour)
	for i := range max {
		_, err := s.Take(context.Background(), []algo.Hit{{Key: uniq(t), Limit: l, Cost: 1}})
		if errors.Is(err, want) {
			return i
		}
		if causeOf(err) != before {
			t.Fatalf("call %d: %v (cause %q), want cause %q until the circuit opens", i+1, err, causeOf(err), before)
		}
	}
	t.Fatalf("the circuit did not open within %d calls (state %s)", max, s.BreakerState())
	return 0
}

// recovers waits (10 s at most) for a call to succeed, then checks that
// the circuit closed and the store is healthy.
func recovers(t *testing.T, s *memcache.Store) {
	t.Helper()
	l := fixed(1000, time.Hour)
	eventually(t, 10*time.Second, func() bool {
		_, err := s.Take(context.Background(), []algo.Hit{{Key: uniq(t), Limit: l, Cost: 1}})
		return err == nil
	}, "a call succeeds after memcached came back")
	if st := s.BreakerState(); st != "closed" || !s.Healthy() {
		t.Fatalf("after a call succeeded: circuit %s, healthy %v; want closed and healthy", st, s.Healthy())
	}
}

// A frozen memcached (SIGSTOP, as a black-holed network): calls wait their
// budget and fail with cause timeout until the stalls span FailFor, then
// the circuit opens and calls are refused with ErrStalledOpen (cause
// timeout: shed, never admitted uncounted) without calling memcached;
// once memcached resumes, a half-open probe closes the circuit.
func TestFrozenOpensCircuit(t *testing.T) {
	srv := memcachetest.Start(t)
	s := newBreakerStore(t, srv)
	take(t, s, algo.Hit{Key: uniq(t), Limit: fixed(5, time.Hour), Cost: 1})
	if !s.Healthy() || s.BreakerState() != "closed" {
		t.Fatalf("at start: healthy %v, circuit %s", s.Healthy(), s.BreakerState())
	}

	srv.Stop()
	t.Cleanup(srv.Cont)
	// Each stalled call takes the 50 ms Timeout: FailFor (1 s) of them is
	// about 20; many more would mean the circuit never opens.
	failed := untilRefused(t, s, memcache.ErrStalledOpen, memcache.CauseTimeout, 200)
	if failed < breaker.DefaultFailures {
		t.Fatalf("opened after %d stalled calls, want at least %d", failed, breaker.DefaultFailures)
	}
	if s.Healthy() || s.BreakerState() == "closed" {
		t.Fatalf("circuit open: healthy %v, circuit %s", s.Healthy(), s.BreakerState())
	}
	if c := causeOf(memcache.ErrStalledOpen); c != memcache.CauseTimeout {
		t.Fatalf("ErrStalledOpen has cause %q, want timeout", c)
	}

	srv.Cont()
	recovers(t, s)
}

// A killed memcached: refused connections are failures memcached proves,
// so Failures of them in a row open the circuit at once (no FailFor), and
// calls are refused with ErrCircuitOpen (cause circuit_open: the rules'
// failure modes); after a restart a probe closes it.
func TestKilledOpensCircuit(t *testing.T) {
	srv := memcachetest.Start(t)
	s := newBreakerStore(t, srv)
	take(t, s, algo.Hit{Key: uniq(t), Limit: fixed(5, time.Hour), Cost: 1})

	srv.Kill()
	failed := untilRefused(t, s, memcache.ErrCircuitOpen, memcache.CauseRefused, 50)
	if failed < breaker.DefaultFailures {
		t.Fatalf("opened after %d refused calls, want at least %d", failed, breaker.DefaultFailures)
	}
	if c := causeOf(memcache.ErrCircuitOpen); c != memcache.CauseCircuitOpen {
		t.Fatalf("ErrCircuitOpen has cause %q, want circuit_open", c)
	}

	srv.Restart()
	recovers(t, s)
}

// An idle store whose circuit is open recovers without traffic: after
// OpenFor its health probe goes through the breaker as a half-open probe
// and closes it once memcached answers; Healthy is false until then.
func TestIdleStoreClosesCircuitByProbe(t *testing.T) {
	srv := memcachetest.Start(t)
	o := memcache.DefaultOptions()
	o.Addrs = []string{srv.Addr()}
	o.HealthInterval = 50 * time.Millisecond
	s, err := memcache.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	eventually(t, 10*time.Second, s.Healthy, "healthy at start")

	srv.Kill()
	untilRefused(t, s, memcache.ErrCircuitOpen, memcache.CauseRefused, 50)
	srv.Restart()
	eventually(t, 10*time.Second, s.Healthy, "healthy after the restart, without a call")
	if st := s.BreakerState(); st != "closed" {
		t.Fatalf("healthy with the circuit %s", st)
	}
}
