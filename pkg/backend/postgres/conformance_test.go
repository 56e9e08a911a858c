package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// newStore starts a Store on a fresh database of srv, closed when t ends.
func newStore(t testing.TB, srv *pgtest.Server, db string, edit ...func(*postgres.Options)) *postgres.Store {
	t.Helper()
	o := postgres.DefaultOptions()
	o.URL = srv.URL(db)
	o.Timeout = 2 * time.Second // generous: no decision of a healthy server may time out
	for _, e := range edit {
		e(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.New(ctx, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// supported reports whether every hit of tb is of a kind the store
// decides.
func supported(tb algotest.Table) bool {
	for _, st := range tb.Steps {
		for _, h := range st.Hits {
			if h.Limit.Kind != algo.FixedWindow && h.Limit.Kind != algo.SlidingWindow {
				return false
			}
		}
	}
	return true
}

// penalised reports whether a step of tb has a penalty box.
func penalised(tb algotest.Table) bool {
	for _, st := range tb.Steps {
		for _, h := range st.Hits {
			if h.Penalty.On() {
				return true
			}
		}
	}
	return false
}

// TestConformance runs the conformance tables of the store's kinds
// (fixed window, sliding window; windows of seconds to years, calendar
// months and years included) at the tables' instants (SetNow), every
// table on one database.
func TestConformance(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	var tables []algotest.Table
	for _, tb := range algotest.Tables() {
		if penalised(tb) {
			continue // the durable store has no penalty box: the loader refuses one on its limits
		}
		if supported(tb) {
			tables = append(tables, tb)
			continue
		}
		// A table that mixes in other kinds (refunds, always_charge,
		// multi-hit) runs its steps of fixed and sliding windows: their
		// keys are the other steps' only in requests the other kinds do
		// not change them in.
		part := algotest.Table{Name: tb.Name + "/fixed_and_sliding"}
		for _, st := range tb.Steps {
			if supported(algotest.Table{Steps: []algotest.Step{st}}) {
				part.Steps = append(part.Steps, st)
			}
		}
		if len(part.Steps) > 0 {
			tables = append(tables, part)
		}
	}
	if len(tables) < 12 {
		t.Fatalf("only %d conformance tables of fixed and sliding windows", len(tables))
	}
	algotest.RunTables(t, tables, func(t *testing.T, now func() time.Time) algotest.Store {
		s := newStore(t, srv, db, func(o *postgres.Options) { o.SweepInterval = 0 })
		s.SetNow(now)
		return s
	})
}
