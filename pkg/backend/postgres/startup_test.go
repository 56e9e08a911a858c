package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// newDown is New on a PostgreSQL that is down: it returns at once, with
// the Store not healthy.
func newDown(t *testing.T, o postgres.Options) (*postgres.Store, *clock.Manual) {
	t.Helper()
	return newUnhealthy(t, o, slack)
}

// newUnhealthy is New on a PostgreSQL that answers but refuses the
// login: it returns within bound, with the Store not healthy. The Store
// is on a clock the test moves (each Tick is one connect attempt), with
// no sweeper, whose timer would otherwise be one to Tick too.
func newUnhealthy(t *testing.T, o postgres.Options, bound time.Duration) (*postgres.Store, *clock.Manual) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o.SweepInterval = 0
	clk := clock.NewManual()
	start := time.Now()
	s, err := postgres.NewOnClock(ctx, o, clk)
	if err != nil {
		t.Fatalf("New with PostgreSQL down: %v, want a Store that is not healthy", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if took := time.Since(start); took > bound {
		t.Errorf("New with PostgreSQL down took %v, want within %v", took, bound)
	}
	if s.Healthy() {
		t.Fatal("healthy with PostgreSQL down")
	}
	return s, clk
}

// TestStartWithoutPostgres: New on a PostgreSQL that is down returns a
// Store at once; its decisions fail within the caller's deadline with
// cause refused (without calling PostgreSQL) and it is not healthy. Once
// PostgreSQL accepts connections, the idle Store migrates the schema and
// is healthy within recoveryProbes runs of its connect loop and probe,
// and decisions are counted.
func TestStartWithoutPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	srv.Kill()
	o := postgres.DefaultOptions()
	o.URL = srv.URL(db)
	o.Timeout = 2 * time.Second
	s, clk := newDown(t, o)
	hit := algo.Hit{Key: "started-down", Limit: longWindow, Cost: 1}
	const budget = 200 * time.Millisecond
	for i := range 20 {
		took, err := takeWithin(s, budget, hit)
		if err == nil {
			t.Fatalf("take %d with PostgreSQL down: no error", i)
		}
		if c := causeOf(err); c != postgres.CauseRefused {
			t.Fatalf("take %d: cause %q (%v), want %s", i, c, err, postgres.CauseRefused)
		}
		if took > budget+slack {
			t.Errorf("take %d took %v, the caller's deadline is %v", i, took, budget)
		}
	}
	if s.Healthy() {
		t.Fatal("healthy with PostgreSQL down")
	}
	srv.Restart()
	probes := tickHealthy(t, s, clk)
	t.Logf("healthy after %d runs since PostgreSQL accepted connections", probes)
	if probes > recoveryProbes {
		t.Errorf("healthy after %d runs since PostgreSQL accepted connections, want within %d", probes, recoveryProbes)
	}
	if d := take(t, s, hit); !d[0].Allowed || d[0].Remaining != longWindow.Rate-1 {
		t.Fatalf("first decision after PostgreSQL came: %+v, want allowed with %d remaining", d[0], longWindow.Rate-1)
	}
	if v := srv.QueryInt(t, db, "SELECT version FROM ratelimitd_schema"); v != postgres.SchemaVersion {
		t.Fatalf("schema version %d, want %d", v, postgres.SchemaVersion)
	}
	if n := srv.QueryInt(t, db, "SELECT count FROM ratelimitd_counters WHERE key = $1", hit.Key); n != 1 {
		t.Fatalf("the row counts %d, want 1", n)
	}
}

// TestSchemaNewerFoundLater: a Store started with PostgreSQL down that
// then finds a schema newer than the binary stays unhealthy, answers
// cause schema, and logs it once at error level; once the operator
// replaces the schema, it migrates it and is healthy.
func TestSchemaNewerFoundLater(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	srv.Exec(t, db, "CREATE TABLE ratelimitd_schema (id int PRIMARY KEY CHECK (id = 1), version int NOT NULL)")
	srv.Exec(t, db, "INSERT INTO ratelimitd_schema VALUES (1, $1)", postgres.SchemaVersion+1)
	srv.Kill()
	var logs testproc.Buffer
	o := postgres.DefaultOptions()
	o.URL = srv.URL(db)
	o.Timeout = 2 * time.Second
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s, clk := newDown(t, o)
	srv.Restart()
	hit := algo.Hit{Key: "newer", Limit: longWindow, Cost: 1}
	var err error
	for i := 0; ; i++ {
		_, err = takeWithin(s, time.Second, hit)
		if causeOf(err) == postgres.CauseSchema {
			break
		}
		if i == 100 {
			t.Fatalf("%d connect attempts after PostgreSQL came: %v, want cause %s", i, err, postgres.CauseSchema)
		}
		clk.Tick(t)
	}
	if !errors.Is(err, postgres.ErrSchemaNewer) {
		t.Fatalf("take on a newer schema: %v, want ErrSchemaNewer", err)
	}
	for range 5 { // several more attempts, none logged
		clk.Tick(t)
	}
	if s.Healthy() {
		t.Fatal("healthy on a newer schema")
	}
	if n := strings.Count(logs.String(), "schema is not usable"); n != 1 || !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("the newer schema logged %d times, want once at error level; logs:\n%s", n, logs.String())
	}
	srv.Exec(t, db, "DROP TABLE ratelimitd_schema")
	tickHealthy(t, s, clk)
	if d := take(t, s, hit); !d[0].Allowed {
		t.Fatalf("after the schema was replaced: %+v, want allowed", d[0])
	}
}

// TestAsyncCommitSession: Options.AsyncCommit sets synchronous_commit off
// for the store's sessions, and only then.
func TestAsyncCommitSession(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	for _, async := range []bool{false, true} {
		s := newStore(t, srv, db, func(o *postgres.Options) { o.AsyncCommit = async })
		want := "on"
		if async {
			want = "off"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := s.Setting(ctx, "synchronous_commit")
		cancel()
		if err != nil || v != want {
			t.Errorf("AsyncCommit %v: synchronous_commit %q (%v), want %q", async, v, err, want)
		}
	}
}

// loginFailures counts the server log's refused logins of User.
func loginFailures(srv *pgtest.Server) int {
	return strings.Count(srv.Log(), `password authentication failed for user "`+pgtest.User+`"`)
}

// TestWrongPasswordBacksOff: with a wrong password the Store starts
// unhealthy with cause auth and retries with a backoff from 1 s doubling:
// over window of the Store's clock the server sees at most the first
// attempt's logins (the pool's connections dialed ahead and the
// migration), one per backoff step and a margin, where a retry every
// 100 ms would be dozens. Once the server accepts that password the Store
// is healthy at the next attempt.
func TestWrongPasswordBacksOff(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	before := loginFailures(srv)
	var logs testproc.Buffer
	o := postgres.DefaultOptions()
	o.URL = srv.URL(db)
	o.Password = "wrong-" + srv.Password
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s, clk := newUnhealthy(t, o, o.ConnectTimeout)
	if _, err := takeWithin(s, time.Second, algo.Hit{Key: "auth", Limit: longWindow, Cost: 1}); causeOf(err) != postgres.CauseRefused {
		t.Fatalf("take before the login succeeded: %v, want cause %s (not connected)", err, postgres.CauseRefused)
	}
	const window = 3500 * time.Millisecond // backoff steps 1 s, 2 s: two retries
	// Each Tick is one attempt; the next is due when the one before
	// returned (the time the store's clock then shows) plus the wait it
	// armed.
	start := clk.Now()
	for next := clk.Tick(t); clk.Now().Sub(start)+next <= window; {
		next = clk.Tick(t)
	}
	const firstAttempt = 4 + 1 // connections dialed ahead, the migration's
	const steps, margin = 2, 3
	n := loginFailures(srv) - before
	t.Logf("%d refused logins in %v", n, window)
	if n > firstAttempt+steps+margin {
		t.Errorf("%d refused logins in %v, want at most %d (a backoff)", n, window, firstAttempt+steps+margin)
	}
	if l := logs.String(); !strings.Contains(l, "cause=auth") || !strings.Contains(l, "pg_hba.conf") {
		t.Errorf("the log does not say the login was refused and what to check:\n%s", l)
	}
	srv.Exec(t, "postgres", "ALTER USER "+pgtest.User+" PASSWORD '"+o.Password+"'")
	tickHealthy(t, s, clk)
}

// TestTLSRefusedCause: sslmode=verify-full against a server without TLS
// starts unhealthy with cause tls (not refused), logged with what to
// check.
func TestTLSRefusedCause(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	var logs testproc.Buffer
	o := postgres.DefaultOptions()
	o.URL = strings.Replace(srv.URL(db), "sslmode=disable", "sslmode=verify-full", 1)
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	newUnhealthy(t, o, o.ConnectTimeout)
	if l := logs.String(); !strings.Contains(l, "cause=tls") || !strings.Contains(l, "sslmode") {
		t.Fatalf("the log does not give cause tls and what to check:\n%s", l)
	}
}

// TestMissingDatabaseStartsUnhealthy: a URL naming a database that does
// not exist yet starts unhealthy (as an unreachable server does, so that
// the order in which they start does not matter) and is healthy once the
// database is created.
func TestMissingDatabaseStartsUnhealthy(t *testing.T) {
	srv := pgtest.Start(t)
	o := postgres.DefaultOptions()
	o.URL = srv.URL("created_later")
	s, clk := newUnhealthy(t, o, o.ConnectTimeout)
	srv.Exec(t, "postgres", "CREATE DATABASE created_later")
	tickHealthy(t, s, clk)
	if d := take(t, s, algo.Hit{Key: "later", Limit: longWindow, Cost: 1}); !d[0].Allowed {
		t.Fatalf("first decision: %+v, want allowed", d[0])
	}
}
