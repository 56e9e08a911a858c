package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// TestSweepBatches: Sweep deletes every expired row in batches of
// SweepBatch, keeps the live rows, and skips a row a transaction holds
// locked instead of waiting for it.
func TestSweepBatches(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	s := newStore(t, srv, db, func(o *postgres.Options) { o.SweepInterval, o.SweepBatch = 0, 1000 })
	// Live rows, written by decisions.
	hour := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Hour}
	for _, k := range []string{"live/a", "live/b", "live/c"} {
		take(t, s, algo.Hit{Key: k, Limit: hour, Cost: 1})
	}
	// 2500 expired rows (windows that ended an hour ago) and one more
	// that another transaction holds locked.
	srv.Exec(t, db, `INSERT INTO ratelimitd_counters (key, win, count, prev, expires_us)
SELECT 'old/' || i, 0, 1, 0, (extract(epoch FROM now()) * 1000000)::bigint - 3600000000 FROM generate_series(1, 2501) i`)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, srv.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM ratelimitd_counters WHERE key = 'old/2501' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	n, err := s.Sweep(sctx)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if n != 2500 || s.Swept() != 2500 {
		t.Fatalf("swept %d (Swept %d), want 2500 (the locked row skipped)", n, s.Swept())
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if left := srv.QueryInt(t, db, "SELECT count(*) FROM ratelimitd_counters WHERE key LIKE 'live/%'"); left != 3 {
		t.Fatalf("%d live rows left, want 3", left)
	}
	if n, err := s.Sweep(sctx); err != nil || n != 1 {
		t.Fatalf("second Sweep: %d, %v; want the row no longer locked", n, err)
	}
	if d := take(t, s, algo.Hit{Key: "live/a", Limit: hour, Cost: 0}); d[0].Remaining != 9 {
		t.Fatalf("live/a after the sweeps: %+v, want 9 remaining", d[0])
	}
}
