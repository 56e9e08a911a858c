package postgres_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// hotKeyRun sends goroutines×perGoroutine one-unit takes of l on one
// fresh key through each store and returns the key, how many were
// admitted and how many failed.
func hotKeyRun(t *testing.T, stores []*postgres.Store, l algo.Limit, goroutines, perGoroutine int) (key string, admitted, failed int64) {
	t.Helper()
	key = "hot/" + algotest.KindName(l.Kind) + "/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var a, f atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, s := range stores {
		for range goroutines {
			wg.Go(func() {
				<-start
				for range perGoroutine {
					d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
					switch {
					case err != nil:
						f.Add(1)
					case d[0].Allowed:
						a.Add(1)
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	return key, a.Load(), f.Load()
}

// waitReconciled waits until no store reconciles a transaction any more
// (at most 30 s).
func waitReconciled(t *testing.T, stores ...*postgres.Store) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range stores {
		for s.Reconciling() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d transactions still reconciled after 30 s", s.Reconciling())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestTimedOutNotCounted: 16 goroutines in each of three stores (three
// pools, as three ratelimitd instances) on one hot key of a durable
// limit, with a Timeout short enough that most decisions time out on a
// loaded host with commits that fsync: what PostgreSQL counts is what was
// admitted, no decision answered as failed spent the quota. For a fixed
// window and a sliding window counter.
func TestTimedOutNotCounted(t *testing.T) {
	srv := pgtest.Start(t, pgtest.WithFsync())
	db := srv.CreateDB(t)
	short := func(o *postgres.Options) { o.Timeout = 30 * time.Millisecond }
	stores := []*postgres.Store{newStore(t, srv, db, short), newStore(t, srv, db, short), newStore(t, srv, db, short)}
	for _, s := range stores { // dial the pools' connections
		warm(t, s, algo.Hit{Key: "warm", Limit: longWindow, Cost: 1})
	}
	fixed := algo.Limit{Kind: algo.FixedWindow, Rate: 40, Period: 3650 * 24 * time.Hour}
	sliding := fixed
	sliding.Kind = algo.SlidingWindow
	for _, l := range []algo.Limit{fixed, sliding} {
		key, admitted, failed := hotKeyRun(t, stores, l, 16, 10)
		waitReconciled(t, stores...)
		counted := srv.QueryInt(t, db, "SELECT coalesce(sum(count + prev), 0) FROM ratelimitd_counters WHERE key = $1", key)
		t.Logf("%s: %d admitted, %d failed of %d; PostgreSQL counts %d", algotest.KindName(l.Kind), admitted, failed, 3*16*10, counted)
		if counted != admitted {
			t.Errorf("%s: PostgreSQL counts %d, %d were admitted: %d decisions answered as failed spent the quota",
				algotest.KindName(l.Kind), counted, admitted, counted-admitted)
		}
		if admitted > l.Rate {
			t.Errorf("%s: %d admitted, the limit is %d", algotest.KindName(l.Kind), admitted, l.Rate)
		}
	}
	var refunded uint64
	for _, s := range stores {
		refunded += s.Refunded()
	}
	t.Logf("%d takes refunded after a late COMMIT", refunded)
}

// TestLateCommitRefunded: PostgreSQL freezes after a batch's decisions
// arrive and before its COMMIT's reply, so that the call fails with a
// timeout; once it resumes the COMMIT is applied, and the store, having
// asked for the transaction's status, refunds the take: the row counts
// what was admitted before, and the next take is admitted with the
// remaining that excludes the failed call.
func TestLateCommitRefunded(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	// A budget that outlasts freezing the server (the hook), so that the
	// COMMIT is sent before the call times out.
	s := newStore(t, srv, db, func(o *postgres.Options) { o.Timeout = 2 * time.Second })
	for _, l := range []algo.Limit{longWindow, {Kind: algo.SlidingWindow, Rate: longWindow.Rate, Period: longWindow.Period}} {
		hit := algo.Hit{Key: "late/" + algotest.KindName(l.Kind), Limit: l, Cost: 1}
		take(t, s, hit)
		take(t, s, hit)
		var froze atomic.Bool
		s.SetBeforeCommit(func() {
			if froze.CompareAndSwap(false, true) {
				srv.Stop()
			}
		})
		_, err := algotest.Take(context.Background(), s, []algo.Hit{hit})
		if causeOf(err) != postgres.CauseTimeout {
			srv.Cont()
			t.Fatalf("%s: take with the COMMIT's reply held: %v, want cause timeout", algotest.KindName(l.Kind), err)
		}
		s.SetBeforeCommit(nil)
		srv.Cont()
		waitReconciled(t, s)
		if n := srv.QueryInt(t, db, "SELECT count + prev FROM ratelimitd_counters WHERE key = $1", hit.Key); n != 2 {
			t.Fatalf("%s: the row counts %d, want 2 (the call answered with a timeout refunded)", algotest.KindName(l.Kind), n)
		}
		warm(t, s, algo.Hit{Key: "warm", Limit: longWindow, Cost: 1})
		if d := take(t, s, hit); !d[0].Allowed || d[0].Remaining != l.Rate-3 {
			t.Fatalf("%s: next take %+v, want allowed with %d remaining", algotest.KindName(l.Kind), d[0], l.Rate-3)
		}
	}
	if s.Refunded() != 2 {
		t.Errorf("%d takes refunded, want 2", s.Refunded())
	}
}

// TestHotKeyOneWaiter: while another transaction holds a key's row, 20
// concurrent calls of one store on that key leave one session waiting on
// the lock in PostgreSQL (one batch), the others queued in the process;
// once the row is released all 20 are decided and counted.
func TestHotKeyOneWaiter(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	s := newStore(t, srv, db, func(o *postgres.Options) { o.Timeout = 30 * time.Second })
	hit := algo.Hit{Key: "one-waiter", Limit: longWindow, Cost: 1}
	take(t, s, hit)
	ctx := context.Background()
	tx := lockRow(t, srv, db, hit.Key)
	const n = 20
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if d, err := algotest.Take(ctx, s, []algo.Hit{hit}); err == nil && d[0].Allowed {
				admitted.Add(1)
			}
		})
	}
	waiting := func() int64 { return lockWaiters(t, srv, db) }
	deadline := time.Now().Add(20 * time.Second)
	for s.InLanes() < n || waiting() < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: %d calls in flight or queued, %d sessions waiting on the lock", s.InLanes(), waiting())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w := waiting(); w != 1 {
		t.Errorf("%d sessions of the store wait on the row lock, want 1 (the others queued in the process)", w)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if admitted.Load() != n {
		t.Fatalf("%d of %d admitted once the row was released", admitted.Load(), n)
	}
	if got := srv.QueryInt(t, db, "SELECT count FROM ratelimitd_counters WHERE key = $1", hit.Key); got != n+1 {
		t.Fatalf("the row counts %d, want %d", got, n+1)
	}
}
