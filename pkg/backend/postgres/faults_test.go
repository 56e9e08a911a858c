package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// slack is the scheduling delay allowed past a bound before a call
// returns.
const slack = 300 * time.Millisecond

// recoveryProbes is how many runs of the health probe (or of the connect
// loop), unhealthyProbeInterval apart on the Store's clock, an idle Store
// takes to count decisions again once PostgreSQL accepts connections: 1 s
// of that clock. It is a count rather than a time because the clock runs
// on with real time too, which on a loaded host the probe's own calls
// fill.
const recoveryProbes = int(time.Second / postgres.UnhealthyProbeInterval)

// takeWithin takes hit with a caller's deadline of budget and returns how
// long the call took and its error.
func takeWithin(s *postgres.Store, budget time.Duration, hit algo.Hit) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	_, err := algotest.Take(ctx, s, []algo.Hit{hit})
	return time.Since(start), err
}

func causeOf(err error) string {
	var e *postgres.Error
	if errors.As(err, &e) {
		return e.Cause()
	}
	return ""
}

// waitHealthy polls Healthy every 5 ms, without any decision, and
// returns how long it took to become true (or fails after 10 s).
func waitHealthy(t *testing.T, s *postgres.Store) time.Duration {
	t.Helper()
	start := time.Now()
	for !s.Healthy() {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("not healthy 10 s after PostgreSQL came back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// newStoreOnClock is newStore on a clock the test moves: the breaker's
// and the health probe's. It has no sweeper, whose timer would otherwise
// be one to Tick too.
func newStoreOnClock(t *testing.T, srv *pgtest.Server, db string, edit func(*postgres.Options)) (*postgres.Store, *clock.Manual) {
	t.Helper()
	o := postgres.DefaultOptions()
	o.URL, o.SweepInterval = srv.URL(db), 0
	edit(&o)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := clock.NewManual()
	s, err := postgres.NewOnClock(ctx, o, clk)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, clk
}

// tickHealthy runs the health probe of s (Tick) until s is healthy, at
// most 100 times, and returns how many runs it took. A run that leaves s
// not healthy must arm the next one UnhealthyProbeInterval later at most,
// so that n runs are at most n such intervals of the Store's clock.
func tickHealthy(t *testing.T, s *postgres.Store, clk *clock.Manual) int {
	t.Helper()
	i := 0
	for ; !s.Healthy(); i++ {
		if i == 100 {
			t.Fatalf("not healthy after %d probes since PostgreSQL came back (circuit %s)", i, s.BreakerState())
		}
		next := clk.Tick(t)
		if next > postgres.UnhealthyProbeInterval && !s.Healthy() {
			t.Fatalf("run %d left the Store not healthy and armed the next %v later, want at most %v", i+1, next, postgres.UnhealthyProbeInterval)
		}
	}
	return i
}

// TestKilledThenRestarted: with PostgreSQL killed, decisions fail within
// the caller's deadline with cause refused until the breaker opens, then
// circuit_open at once; Healthy is false. Once it is restarted, the idle
// Store is healthy again within recoveryProbes, and the counts from before
// are there.
func TestKilledThenRestarted(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	s, clk := newStoreOnClock(t, srv, db, func(o *postgres.Options) { o.Timeout = 500 * time.Millisecond })
	hit := algo.Hit{Key: "killed", Limit: longWindow, Cost: 1}
	take(t, s, hit)
	take(t, s, hit)
	srv.Kill()
	const budget = 200 * time.Millisecond
	seen := map[string]int{}
	for i := range 20 {
		took, err := takeWithin(s, budget, hit)
		if err == nil {
			t.Fatalf("take %d with PostgreSQL killed: no error", i)
		}
		if took > budget+slack {
			t.Errorf("take %d took %v, the caller's deadline is %v", i, took, budget)
		}
		seen[causeOf(err)]++
	}
	if seen[postgres.CauseRefused] == 0 || seen[postgres.CauseCircuitOpen] == 0 || len(seen) != 2 {
		t.Fatalf("causes %v, want refused, then circuit_open once the breaker opened", seen)
	}
	if s.Healthy() || s.BreakerState() == "closed" {
		t.Fatalf("healthy %v, circuit %s with PostgreSQL killed", s.Healthy(), s.BreakerState())
	}
	srv.Restart()
	probes := tickHealthy(t, s, clk)
	t.Logf("healthy after %d probes since PostgreSQL accepted connections again", probes)
	if probes > recoveryProbes {
		t.Errorf("healthy after %d probes since PostgreSQL accepted connections again, want within %d", probes, recoveryProbes)
	}
	if d := take(t, s, hit); !d[0].Allowed || d[0].Remaining != longWindow.Rate-3 {
		t.Fatalf("after recovery: %+v, want allowed with %d remaining (the 2 before the kill counted)", d[0], longWindow.Rate-3)
	}
}

// TestStalledThenResumed: with PostgreSQL frozen (SIGSTOP), a decision
// returns by its caller's deadline with cause timeout; the breaker opens
// once the stall lasts FailFor, and refuses at once (cause timeout). Once
// resumed, the idle Store is healthy within recoveryProbes.
func TestStalledThenResumed(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	s, clk := newStoreOnClock(t, srv, db, func(o *postgres.Options) { o.Timeout = 100 * time.Millisecond })
	hit := algo.Hit{Key: "stalled", Limit: longWindow, Cost: 1}
	warm(t, s, hit)
	srv.Stop()
	defer srv.Cont()
	const budget = 150 * time.Millisecond
	start := time.Now()
	opened := false
	for i := 0; time.Since(start) < 10*time.Second; i++ {
		took, err := takeWithin(s, budget, hit)
		if err == nil {
			t.Fatalf("take %d with PostgreSQL frozen: no error", i)
		}
		if c := causeOf(err); c != postgres.CauseTimeout {
			t.Fatalf("take %d: cause %q (%v), want %s", i, c, err, postgres.CauseTimeout)
		}
		if took > budget+slack {
			t.Errorf("take %d took %v, the caller's deadline is %v", i, took, budget)
		}
		if errors.Is(err, postgres.ErrStalledOpen) {
			opened = true
			break
		}
	}
	if !opened || s.Healthy() {
		t.Fatalf("breaker opened %v, healthy %v after a stall of %v", opened, s.Healthy(), time.Since(start))
	}
	srv.Cont()
	probes := tickHealthy(t, s, clk)
	t.Logf("healthy after %d probes since PostgreSQL resumed", probes)
	if probes > recoveryProbes {
		t.Errorf("healthy after %d probes since PostgreSQL resumed, want within %d", probes, recoveryProbes)
	}
	warm(t, s, hit)
}

// warm takes hit until a take succeeds (a fresh connection's first
// decision may outlast a short Timeout), for at most 10 s.
func warm(t *testing.T, s *postgres.Store, hit algo.Hit) {
	t.Helper()
	start := time.Now()
	for {
		_, err := algotest.Take(context.Background(), s, []algo.Hit{hit})
		if err == nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no decision within 10 s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPasswordNeverShown: the password (in the URL, or given on its own)
// appears in no error of New or Take and in no log line, whatever fails:
// a refused connection or a wrong password (the Store starts and retries
// in the background), a bad URL, a killed server.
func TestPasswordNeverShown(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	var logs testproc.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var texts []string
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		texts = append(texts, what+": "+err.Error())
	}
	newWith := func(url, pw string) error {
		o := postgres.DefaultOptions()
		o.URL, o.Password, o.Logger, o.SweepInterval = url, pw, logger, 0
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		clk := clock.NewManual()
		s, err := postgres.NewOnClock(ctx, o, clk)
		if err != nil {
			return err
		}
		// Unreachable: the Store starts unhealthy and retries in the
		// background (and logs); its decisions fail.
		defer s.Close()
		for range 3 { // three more attempts
			clk.Tick(t)
		}
		_, err = algotest.Take(ctx, s, []algo.Hit{{Key: "pw", Limit: longWindow, Cost: 1}})
		return err
	}
	wrong := "wrong-" + srv.Password
	closed := "postgres://" + pgtest.User + ":" + srv.Password + "@127.0.0.1:1/" + db + "?sslmode=disable"
	check("refused", newWith(closed, ""))
	check("refused, password given", newWith("postgres://"+pgtest.User+"@127.0.0.1:1/"+db+"?sslmode=disable", srv.Password))
	check("wrong password in the URL", newWith(strings.Replace(srv.URL(db), srv.Password, wrong, 1), ""))
	check("wrong password given", newWith(srv.URLNoPassword(db), wrong))
	check("bad URL", newWith("postgres://"+pgtest.User+":"+srv.Password+"@127.0.0.1:notaport/x", ""))
	check("bad URL parameter", newWith(strings.Replace(srv.URL(db), "sslmode=disable", "sslmode=bogus", 1), ""))
	// Refused URLs: a libpq key/value string, and passwords with
	// characters a URL reserves, unescaped. Each is refused with a hint
	// to percent-encode the password, and never shown.
	odd := []string{"kv-" + srv.Password}
	refused := map[string]string{"key/value string": "host=127.0.0.1 port=1 user=" + pgtest.User + " password=" + odd[0] + " dbname=" + db}
	for _, c := range []string{"#", "/", "?", " ", "%zz"} {
		pw := "p" + c + srv.Password
		odd = append(odd, pw)
		refused["password with "+c] = "postgres://" + pgtest.User + ":" + pw + "@127.0.0.1:1/" + db
	}
	for what, u := range refused {
		err := newWith(u, "")
		check(what, err)
		if !strings.Contains(err.Error(), "percent-encode") {
			t.Errorf("%s: no hint to percent-encode the password: %v", what, err)
		}
		texts = append(texts, postgres.RedactURL(u))
	}
	o := postgres.DefaultOptions()
	o.URL, o.Logger, o.SweepInterval = srv.URLNoPassword(db), logger, 10*time.Millisecond
	o.Password = srv.Password
	clk := clock.NewManual()
	s, err := postgres.NewOnClock(context.Background(), o, clk)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv.Kill()
	for i := 0; s.SweepErrors() == 0; i++ { // sweeps fail and log
		if i == 100 {
			t.Fatalf("no sweep failed in %d runs of the store's loops with PostgreSQL killed", i)
		}
		clk.Tick(t)
	}
	for range 8 {
		_, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "pw", Limit: longWindow, Cost: 1}})
		check("take, server killed", err)
	}
	texts = append(texts, logs.String(), postgres.RedactURL(srv.URL(db)), postgres.RedactURL(closed))
	for _, txt := range texts {
		for _, pw := range append([]string{srv.Password, wrong}, odd...) {
			if strings.Contains(txt, pw) {
				t.Errorf("the password is shown: %s", txt)
			}
		}
	}
	if !strings.Contains(logs.String(), "sweeping expired rows failed") {
		t.Errorf("no sweeper error logged; logs:\n%s", logs.String())
	}
}

// TestLockWaitBounded: a decision on a row another transaction holds
// locked returns by its budget with cause timeout, and its session stops
// waiting on the server too (the closed connection ends it; lock_timeout
// when the close does not reach the server), instead of deciding, and
// counting, once the lock is released long after its caller gave up.
func TestLockWaitBounded(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	s := newStore(t, srv, db, func(o *postgres.Options) { o.Timeout = 200 * time.Millisecond })
	hit := algo.Hit{Key: "locked", Limit: longWindow, Cost: 1}
	warm(t, s, hit)
	ctx := context.Background()
	tx := lockRow(t, srv, db, hit.Key)
	const budget = time.Second
	took, err := takeWithin(s, budget, hit)
	if causeOf(err) != postgres.CauseTimeout || took > budget+slack {
		t.Fatalf("take on a locked row: %v after %v, want cause timeout within %v", err, took, budget)
	}
	// No session of the store is left waiting for the lock.
	waiting := func() int64 { return lockWaiters(t, srv, db) }
	deadline := time.Now().Add(5 * time.Second)
	for waiting() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a store session still waits on the lock 5 s after its caller gave up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := srv.QueryInt(t, db, "SELECT count FROM ratelimitd_counters WHERE key = $1", hit.Key); n != 1 {
		t.Fatalf("the row counts %d, want 1 (the abandoned decision not counted)", n)
	}
}

// lockRow holds key's counter row locked (SELECT … FOR UPDATE) in a
// transaction of its own, until the test rolls it back or ends.
func lockRow(t *testing.T, srv *pgtest.Server, db, key string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, srv.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(ctx) })
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "SELECT 1 FROM ratelimitd_counters WHERE key = $1 FOR UPDATE", key); err != nil {
		t.Fatal(err)
	}
	return tx
}

// lockWaiters is how many sessions of the store wait on a lock.
func lockWaiters(t *testing.T, srv *pgtest.Server, db string) int64 {
	t.Helper()
	return srv.QueryInt(t, db, `SELECT count(*) FROM pg_stat_activity
WHERE application_name = 'ratelimitd' AND wait_event_type = 'Lock'`)
}
