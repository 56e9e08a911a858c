package memcache_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
)

// newBreakerStore is a store on srv with the default Timeout (50 ms) and
// the health probe every probe (0: none, only the test's calls reach the
// breaker), on a clock the test moves.
func newBreakerStore(t *testing.T, srv *memcachetest.Server, probe time.Duration, onCircuit func(breaker.State)) (*memcache.Store, *clock.Manual) {
	t.Helper()
	o := memcache.DefaultOptions()
	o.Addrs = []string{srv.Addr()}
	o.HealthInterval = probe
	o.OnCircuit = onCircuit
	clk := clock.NewManual()
	s, err := memcache.NewOnClock(o, clk)
	if err != nil {
		t.Fatalf("memcache.NewOnClock: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, clk
}

// untilRefused calls s until a call is refused by the open circuit with
// want, at most max calls; every call before it must fail with cause
// before. It returns how many calls failed before the refusal.
func untilRefused(t *testing.T, s *memcache.Store, want error, before string, max int) int {
	t.Helper()
	l := fixed(1000, time.Hour)
	for i := range max {
		_, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: uniq(t), Limit: l, Cost: 1}})
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

// warm calls s until a call succeeds, for at most 10 s: a fresh
// connection's first call on a loaded host may outlast the 50 ms Timeout.
// The success closes the circuit and ends any run of failures.
func warm(t *testing.T, s *memcache.Store) {
	t.Helper()
	start := time.Now()
	for {
		_, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: uniq(t), Limit: fixed(5, time.Hour), Cost: 1}})
		if err == nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no call succeeded within 10 s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// recovers moves clk past OpenFor and calls s, as a half-open probe,
// until a call succeeds (at most 100 times: a slow call may outlast the
// Timeout and reopen the circuit), then checks that the circuit closed and
// the store is healthy.
func recovers(t *testing.T, s *memcache.Store, clk *clock.Manual) {
	t.Helper()
	l := fixed(1000, time.Hour)
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatalf("no call succeeded in %d half-open probes after memcached came back (circuit %s)", i, s.BreakerState())
		}
		clk.Advance(breaker.DefaultOpenFor)
		if _, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: uniq(t), Limit: l, Cost: 1}}); err == nil {
			break
		}
	}
	if st := s.BreakerState(); st != "closed" || !s.Healthy() {
		t.Fatalf("after a call succeeded: circuit %s, healthy %v; want closed and healthy", st, s.Healthy())
	}
}

// TestFailingMemcachedOpensCircuit: a memcached that fails opens the
// circuit, and calls are then refused without calling memcached; once it
// is back a half-open probe closes the circuit:
//   - frozen (SIGSTOP, as a black-holed network): calls wait their budget
//     and fail with cause timeout until the stalls span FailFor, then are
//     refused with ErrStalledOpen (cause timeout: shed, never admitted
//     uncounted);
//   - killed: refused connections are failures memcached proves, so
//     Failures of them in a row open the circuit at once (no FailFor), and
//     calls are refused with ErrCircuitOpen (cause circuit_open: the
//     rules' failure modes).
func TestFailingMemcachedOpensCircuit(t *testing.T) {
	for _, f := range []struct {
		name                 string
		fail, heal           func(*memcachetest.Server)
		refusal              error
		before, refusalCause string
		max                  int // calls before the refusal, at most
	}{
		// Each stalled call takes the 50 ms Timeout: FailFor (1 s) of
		// them is about 20; many more would mean it never opens.
		{"frozen", (*memcachetest.Server).Stop, (*memcachetest.Server).Cont, memcache.ErrStalledOpen, memcache.CauseTimeout, memcache.CauseTimeout, 200},
		{"killed", (*memcachetest.Server).Kill, (*memcachetest.Server).Restart, memcache.ErrCircuitOpen, memcache.CauseRefused, memcache.CauseCircuitOpen, 50},
	} {
		t.Run(f.name, func(t *testing.T) {
			srv := memcachetest.Start(t)
			var mu sync.Mutex
			var seen []string
			s, clk := newBreakerStore(t, srv, 0, func(to breaker.State) { mu.Lock(); seen = append(seen, to.String()); mu.Unlock() })
			warm(t, s)
			mu.Lock()
			seen = nil // the transitions of a slow first connection, if any
			mu.Unlock()
			if !s.Healthy() || s.BreakerState() != "closed" {
				t.Fatalf("at start: healthy %v, circuit %s", s.Healthy(), s.BreakerState())
			}

			f.fail(srv)
			t.Cleanup(srv.Cont) // a no-op unless still frozen
			failed := untilRefused(t, s, f.refusal, f.before, f.max)
			if failed < breaker.DefaultFailures {
				t.Fatalf("opened after %d failed calls, want at least %d", failed, breaker.DefaultFailures)
			}
			if s.Healthy() || s.BreakerState() == "closed" {
				t.Fatalf("circuit open: healthy %v, circuit %s", s.Healthy(), s.BreakerState())
			}
			if c := causeOf(f.refusal); c != f.refusalCause {
				t.Fatalf("%v has cause %q, want %q", f.refusal, c, f.refusalCause)
			}

			f.heal(srv)
			recovers(t, s, clk)
			// Options.OnCircuit saw every transition, in order.
			mu.Lock()
			defer mu.Unlock()
			if got := strings.Join(seen, ","); !strings.HasPrefix(got, "open,") || !strings.HasSuffix(got, "half_open,closed") {
				t.Errorf("OnCircuit saw %q, want open first and half_open,closed last", got)
			}
		})
	}
}

// An idle store whose circuit is open recovers without traffic: after
// OpenFor its health probe goes through the breaker as a half-open probe
// and closes it once memcached answers; Healthy is false until then.
func TestIdleStoreClosesCircuitByProbe(t *testing.T) {
	srv := memcachetest.Start(t)
	s, clk := newBreakerStore(t, srv, 50*time.Millisecond, nil)
	tickUntil(t, clk, 0, s.Healthy, "healthy at start")

	srv.Kill()
	untilRefused(t, s, memcache.ErrCircuitOpen, memcache.CauseRefused, 50)
	srv.Restart()
	// Each probe after OpenFor is a half-open probe.
	tickUntil(t, clk, breaker.DefaultOpenFor, s.Healthy, "healthy after the restart, without a call")
	if st := s.BreakerState(); st != "closed" {
		t.Fatalf("healthy with the circuit %s", st)
	}
}

// With several servers no circuit opens for all of them: one killed server
// fails only the decisions on its keys (cause refused, each call, however
// many in a row), and the keys of the other are still decided and
// counted.
func TestSeveralServersShareNoCircuit(t *testing.T) {
	live, dead := memcachetest.Start(t), memcachetest.Start(t)
	o := memcache.DefaultOptions()
	o.Addrs = []string{live.Addr(), dead.Addr()}
	o.HealthInterval = 0
	// A live server's reply is never late on purpose here, so a slow
	// reply must not turn a decided call into a timeout.
	o.Timeout = 10 * time.Second
	s := openStore(t, o)
	dead.Kill()
	l := fixed(1000, time.Hour)
	call := func(key string) ([]algo.Decision, error) {
		return algotest.Take(context.Background(), s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
	}
	// Which keys live on which server.
	var onLive, onDead []string
	for i := range 20 {
		key := uniq(t) + "." + strconv.Itoa(i)
		d, err := call(key)
		switch {
		case err == nil && d[0].Allowed && d[0].Remaining == 999:
			onLive = append(onLive, key)
		case causeOf(err) == memcache.CauseRefused:
			onDead = append(onDead, key)
		default:
			t.Fatalf("%s: %+v, %v (cause %q): want decided, or refused by the dead server", key, d, err, causeOf(err))
		}
	}
	if len(onLive) == 0 || len(onDead) == 0 {
		t.Fatalf("20 keys: %d on the live server, %d on the dead one; want both", len(onLive), len(onDead))
	}
	// Many more failures in a row than open a circuit: each is refused by
	// the dead server, none by a circuit.
	for i := range 4 * breaker.DefaultFailures {
		if _, err := call(onDead[i%len(onDead)]); causeOf(err) != memcache.CauseRefused {
			t.Fatalf("failure %d in a row on the dead server: %v (cause %q), want refused", i+1, err, causeOf(err))
		}
	}
	if d, err := call(onLive[0]); err != nil || !d[0].Allowed || d[0].Remaining != 998 {
		t.Fatalf("a key of the live server after them: %+v, %v; want decided and counted (998 remaining)", d, err)
	}
	if st := s.BreakerState(); st != "closed" {
		t.Fatalf("circuit %s with several servers", st)
	}
}
