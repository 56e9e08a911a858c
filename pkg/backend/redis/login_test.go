package redis_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// loginCounts are the server's counters of logins: connections accepted
// (INFO stats) and WRONGPASS replies (INFO errorstats).
func loginCounts(t *testing.T, srv *redistest.Server) (conns, denied int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := srv.Client().Info(ctx, "stats", "errorstats").Result()
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_WRONGPASS:count="); ok {
			if denied, err = strconv.ParseInt(v, 10, 64); err != nil {
				t.Fatalf("INFO errorstats: %q: %v", line, err)
			}
		}
	}
	return redistest.InfoInt(t, info, "total_connections_received"), denied
}

// TestWrongPasswordLoginsBounded: with a wrong password, the Store's
// failed logins do not grow with its traffic, in both counting modes (the
// script, and reference mode's INCRBY and PEXPIRE):
//
//   - a warm-up of 1.5 s, then 600 Takes from 4 goroutines, each fail
//     with cause auth (not "other"), and the server sees at most 30
//     connections and 60 failed AUTHs for all of them (before the fix:
//     one connection and two failed AUTHs per batch of Takes or warm-up
//     connection, hundreds);
//   - no failure is taken for an outage: the circuit never changes state
//     (no open, no half-open probe closing it on the refusal) and the
//     Store is not healthy;
//   - once the password file holds the right password, the Store
//     recovers after the backoff (at most 30 s of its clock).
func TestWrongPasswordLoginsBounded(t *testing.T) {
	for _, native := range []bool{false, true} {
		name := "script"
		if native {
			name = "reference"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.Standalone(t, redistest.WithPassword("right-pw"))
			pwFile := filepath.Join(t.TempDir(), "pw")
			if err := os.WriteFile(pwFile, []byte("wrong-pw\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			clk := bclock.NewManual()
			var transitions atomic.Int64
			o := redis.DefaultOptions()
			o.URL = "redis://" + srv.Addr() + "/0"
			o.PasswordFile = pwFile
			o.NativeCounting = native
			o.MaxWait = 2 * time.Second
			o.Breaker.OnTransition = func(redis.BreakerState) { transitions.Add(1) }
			s, err := redis.NewOnClock(o, clk)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			conns0, denied0 := loginCounts(t, srv)

			// The startup warm-up (--redis-warmup) retries until its time
			// is up: it too dials only once per backoff after a refusal.
			wctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			err = s.Warm(wctx)
			cancel()
			if redis.CauseOf(err) != redis.CauseAuth {
				t.Errorf("Warm: %v (cause %q), want auth", err, redis.CauseOf(err))
			}

			l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
			hit := []algo.Hit{{Key: "login-" + name, Limit: l, Cost: 1, Charge: native}}
			const workers, per = 4, 150
			var wg sync.WaitGroup
			var ok, auth, other atomic.Int64
			var otherErr atomic.Value
			for range workers {
				wg.Go(func() {
					for range per {
						_, err := algotest.Take(context.Background(), s, hit)
						switch {
						case err == nil:
							ok.Add(1)
						case redis.CauseOf(err) == redis.CauseAuth:
							auth.Add(1)
						default:
							other.Add(1)
							otherErr.Store(err)
						}
					}
				})
			}
			wg.Wait()
			conns, denied := loginCounts(t, srv)
			t.Logf("warm-up and %d Takes: %d auth, %d other, %d ok; server: %d connections, %d failed AUTHs",
				workers*per, auth.Load(), other.Load(), ok.Load(), conns-conns0, denied-denied0)
			if ok.Load() != 0 || other.Load() != 0 {
				t.Errorf("%d succeeded and %d failed with another cause than auth (%v), want every one auth",
					ok.Load(), other.Load(), otherErr.Load())
			}
			// The first Takes and the probe dial together before the
			// first refusal is known (at most a pool's worth, 16); after
			// it, one dial per backoff: 1 s, 2 s, 4 s, ... of the Store's
			// clock, 7 in the first minute however long the Takes took.
			const bound = 30
			if n := conns - conns0 - 1; n > bound { // -1: loginCounts' own connection
				t.Errorf("%d connections for %d Takes, want at most %d", n, workers*per, bound)
			}
			if n := denied - denied0; n > 2*bound { // HELLO, then AUTH, per connection
				t.Errorf("%d failed AUTHs for %d Takes, want at most %d", n, workers*per, 2*bound)
			}
			if n := transitions.Load(); n != 0 {
				t.Errorf("circuit changed state %d times on a wrong password, want never (an auth refusal is no outage and no success)", n)
			}
			if s.Healthy() {
				t.Error("Healthy with a wrong password")
			}

			// The password fixed: within the longest backoff of the
			// Store's clock, a Take succeeds.
			if err := os.WriteFile(pwFile, []byte("right-pw\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			clk.Advance(31 * time.Second)
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, err := algotest.Take(context.Background(), s, hit)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no Take succeeded 20 s after the password was fixed: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestLoginBackoffSparesPooledConnections: a refused login backs off new
// connections only. NOPERM, a command refused on a connection that stays
// usable, does not start the backoff: the next decision dials and
// succeeds.
func TestLoginBackoffSparesPooledConnections(t *testing.T) {
	srv := redistest.Standalone(t, redistest.WithACLUser("rl", "pw"))
	user, pw := srv.ACLUser()
	o := redis.DefaultOptions()
	o.URL = "redis://" + user + ":" + pw + "@" + srv.Addr() + "/0"
	o.MaxWait = 2 * time.Second
	s := openStore(t, o)
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	take := func(key string) error {
		_, err := algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for take("warm") != nil {
		if time.Now().After(deadline) {
			t.Fatal("no Take succeeded in 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Keys outside the user's ACL now: NOPERM for them alone.
	if _, err := srv.Do(ctx, "ACL", "SETUSER", user, "resetkeys", "~*allowed*"); err != nil {
		t.Fatal(err)
	}
	if err := take("denied"); redis.CauseOf(err) != redis.CauseAuth {
		t.Fatalf("Take of a key outside the ACL: %v (cause %q), want auth", err, redis.CauseOf(err))
	}
	// Another connection dials at once: no backoff after NOPERM.
	if _, err := srv.Do(ctx, "CLIENT", "KILL", "USER", user); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		err := take("allowed")
		if err == nil {
			break
		}
		if redis.CauseOf(err) == redis.CauseAuth || time.Now().After(deadline) {
			t.Fatalf("Take of an allowed key after NOPERM and a lost connection: %v (cause %q), want success", err, redis.CauseOf(err))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
