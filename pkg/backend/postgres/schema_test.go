package postgres_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// dropFunctions drops every ratelimitd_* function of db, as a restore of
// a dump of the tables only leaves the database.
func dropFunctions(t *testing.T, srv *pgtest.Server, db string) {
	t.Helper()
	if n := srv.QueryInt(t, db, `SELECT count(*) FROM pg_proc WHERE proname LIKE 'ratelimitd\_%'`); n == 0 {
		t.Fatal("no ratelimitd_* function to drop")
	}
	srv.Exec(t, db, `DO $$ BEGIN
	EXECUTE (SELECT 'DROP FUNCTION ' || string_agg(oid::regprocedure::text, ', ')
		FROM pg_proc WHERE proname LIKE 'ratelimitd\_%');
END $$`)
}

// takeUntilAllowed takes hit until a decision succeeds (or fails the
// test after 10 s) and returns it.
func takeUntilAllowed(t *testing.T, s *postgres.Store, hit algo.Hit) algo.Decision {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		d, err := algotest.Take(ctx, s, []algo.Hit{hit})
		cancel()
		if err == nil {
			return d[0]
		}
		if c := causeOf(err); c != postgres.CauseSchema {
			t.Fatalf("take with the schema being recreated: %v, want cause %s or a decision", err, postgres.CauseSchema)
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the schema was damaged decisions still fail: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSchemaRestoredWithoutFunctions: a database holding the tables and
// the version row but no function (restored from a dump of the tables)
// gets the functions back at New, which logs what it recreated, and the
// counts from before are kept.
func TestSchemaRestoredWithoutFunctions(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	hit := algo.Hit{Key: "restored", Limit: longWindow, Cost: 1}
	s := newStore(t, srv, db)
	for range 3 {
		take(t, s, hit)
	}
	_ = s.Close()
	dropFunctions(t, srv, db)
	var logs testproc.Buffer
	s2 := newStore(t, srv, db, func(o *postgres.Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	if !s2.Healthy() {
		t.Fatal("not healthy after New recreated the functions")
	}
	if d := take(t, s2, hit); !d[0].Allowed || d[0].Remaining != longWindow.Rate-4 {
		t.Fatalf("after the restore: %+v, want allowed with %d remaining (the 3 counts before kept)", d[0], longWindow.Rate-4)
	}
	if l := logs.String(); !strings.Contains(l, "recreated") || !strings.Contains(l, "ratelimitd_take") {
		t.Fatalf("New did not log the recreated functions; logs:\n%s", l)
	}
}

// TestSchemaVersionTableDropped: with ratelimitd_schema dropped and the
// counters and functions still there, New migrates again (every statement
// is idempotent) and keeps the counts.
func TestSchemaVersionTableDropped(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	hit := algo.Hit{Key: "unversioned", Limit: longWindow, Cost: 1}
	s := newStore(t, srv, db)
	for range 2 {
		take(t, s, hit)
	}
	_ = s.Close()
	srv.Exec(t, db, "DROP TABLE ratelimitd_schema")
	s2 := newStore(t, srv, db)
	if d := take(t, s2, hit); !d[0].Allowed || d[0].Remaining != longWindow.Rate-3 {
		t.Fatalf("after the version table was dropped: %+v, want allowed with %d remaining", d[0], longWindow.Rate-3)
	}
	if v := srv.QueryInt(t, db, "SELECT version FROM ratelimitd_schema"); v != postgres.SchemaVersion {
		t.Fatalf("schema version %d, want %d", v, postgres.SchemaVersion)
	}
}

// TestSchemaRecreatedWhileRunning: with the functions or the counters
// table dropped under a running Store, a decision fails with cause
// schema, and the probe (woken by it) recreates the schema without a
// restart: decisions are counted again, from the kept counts when only
// the functions were dropped, from zero when the table was.
func TestSchemaRecreatedWhileRunning(t *testing.T) {
	srv := pgtest.Start(t)
	for _, tc := range []struct {
		name string
		drop func(t *testing.T, db string)
		want int64 // remaining after the decision that succeeds
	}{
		{"functions", func(t *testing.T, db string) { dropFunctions(t, srv, db) }, longWindow.Rate - 3},
		{"table", func(t *testing.T, db string) { srv.Exec(t, db, "DROP TABLE ratelimitd_counters") }, longWindow.Rate - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := srv.CreateDB(t)
			var logs testproc.Buffer
			s := newStore(t, srv, db, func(o *postgres.Options) {
				o.HealthInterval = time.Hour // only the failed decision wakes the probe
				o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			hit := algo.Hit{Key: "dropped-" + tc.name, Limit: longWindow, Cost: 1}
			for range 2 {
				take(t, s, hit)
			}
			tc.drop(t, db)
			_, err := takeWithin(s, 2*time.Second, hit)
			if causeOf(err) != postgres.CauseSchema {
				t.Fatalf("take with the %s dropped: %v, want cause %s", tc.name, err, postgres.CauseSchema)
			}
			if d := takeUntilAllowed(t, s, hit); !d.Allowed || d.Remaining != tc.want {
				t.Fatalf("first decision after the schema was recreated: %+v, want allowed with %d remaining", d, tc.want)
			}
			waitHealthy(t, s)
			if l := logs.String(); !strings.Contains(l, "recreated") {
				t.Fatalf("the repair was not logged; logs:\n%s", l)
			}
		})
	}
}
