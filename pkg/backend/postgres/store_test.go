package postgres_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// longWindow is a fixed window no test run crosses the end of in
// practice (epoch-aligned, 3650 days).
var longWindow = algo.Limit{Kind: algo.FixedWindow, Rate: 50, Period: 3650 * 24 * time.Hour}

func take(t testing.TB, s *postgres.Store, hits ...algo.Hit) []algo.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := algotest.Take(ctx, s, hits)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	return d
}

// TestConcurrentExactThreeStores: 200 concurrent one-unit takes on one
// fresh key through 3 stores (3 pools) admit exactly the limit, for a
// fixed window and a sliding window counter.
func TestConcurrentExactThreeStores(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	// A hot key's takes wait on its row lock one after the other, and
	// each pool dials its connections (SCRAM) on first use: the budget
	// is generous, the count is what is asserted.
	slow := func(o *postgres.Options) { o.Timeout = 60 * time.Second }
	stores := []*postgres.Store{newStore(t, srv, db, slow), newStore(t, srv, db, slow), newStore(t, srv, db, slow)}
	sliding := longWindow
	sliding.Kind = algo.SlidingWindow
	for _, l := range []algo.Limit{longWindow, sliding} {
		key := "concurrent/" + algotest.KindName(l.Kind) + "/" + strconv.FormatInt(time.Now().UnixNano(), 36)
		got, err := algotest.ConcurrentAllowed(context.Background(), stores, key, l, 200)
		if err != nil {
			t.Fatalf("%s: %v", algotest.KindName(l.Kind), err)
		}
		if got != l.Rate {
			t.Errorf("%s: %d of 200 admitted, want exactly %d", algotest.KindName(l.Kind), got, l.Rate)
		}
	}
}

// helperEnv carries the URL and key to the processes of
// TestConcurrentExactThreeProcesses.
const helperEnv = "RATELIMITD_PGSTORE_HELPER"

// TestMain runs the helper process's takes when helperEnv is set.
func TestMain(m *testing.M) {
	if v := os.Getenv(helperEnv); v != "" {
		os.Exit(helperProcess(v))
	}
	os.Exit(m.Run())
}

// helperProcess: "url|key|n": n concurrent takes on key, prints the
// number allowed.
func helperProcess(v string) int {
	parts := strings.SplitN(v, "|", 3)
	n, _ := strconv.Atoi(parts[2])
	o := postgres.DefaultOptions()
	o.URL, o.Timeout, o.SweepInterval = parts[0], 60*time.Second, 0
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := postgres.New(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer s.Close()
	// Wait for the go signal on stdin, so that the processes start
	// together.
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	got, err := algotest.ConcurrentAllowed(ctx, []*postgres.Store{s}, parts[1], longWindow, n)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(got)
	return 0
}

// TestConcurrentExactThreeProcesses: 3 processes, 67 + 67 + 66
// concurrent takes on one fresh key, admit exactly the limit between
// them.
func TestConcurrentExactThreeProcesses(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	newStore(t, srv, db) // creates the schema
	key := "processes/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	type proc struct {
		cmd *exec.Cmd
		out strings.Builder
		in  *os.File
	}
	var procs []*proc
	for i, n := range []int{67, 67, 66} {
		p := &proc{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		p.cmd.Env = append(os.Environ(), helperEnv+"="+srv.URL(db)+"|"+key+"|"+strconv.Itoa(n))
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		p.cmd.Stdin, p.in = r, w
		p.cmd.Stdout = &p.out
		p.cmd.Stderr = os.Stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
		_ = r.Close()
		procs = append(procs, p)
	}
	for _, p := range procs {
		_, _ = p.in.WriteString("go\n")
		_ = p.in.Close()
	}
	var total int64
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(p.out.String()), 10, 64)
		if err != nil {
			t.Fatalf("process %d printed %q", i, p.out.String())
		}
		total += n
	}
	if total != longWindow.Rate {
		t.Errorf("3 processes admitted %d of 200, want exactly %d", total, longWindow.Rate)
	}
}

// TestDailyQuotaSurvivesRestart: a 5-per-day limit admits 5 and denies
// the 6th; a new Store on the same database (a ratelimitd restart), and
// then a killed and restarted PostgreSQL, still deny.
func TestDailyQuotaSurvivesRestart(t *testing.T) {
	srv := pgtest.Start(t, pgtest.WithFsync())
	db := srv.CreateDB(t)
	day := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: 24 * time.Hour}
	hit := algo.Hit{Key: "daily/" + strconv.FormatInt(time.Now().UnixNano(), 36), Limit: day, Cost: 1}
	s := newStore(t, srv, db)
	for i := range 5 {
		if d := take(t, s, hit); !d[0].Allowed || d[0].Remaining != int64(4-i) {
			t.Fatalf("take %d: %+v, want allowed with %d remaining", i+1, d[0], 4-i)
		}
	}
	if d := take(t, s, hit); d[0].Allowed || d[0].RetryAfter <= 0 {
		t.Fatalf("6th take: %+v, want denied with a RetryAfter", d[0])
	}
	_ = s.Close()
	s2 := newStore(t, srv, db)
	if d := take(t, s2, hit); d[0].Allowed {
		t.Fatalf("after a store restart: %+v, want denied", d[0])
	}
	_ = s2.Close()
	srv.Kill()
	srv.Restart()
	s3 := newStore(t, srv, db)
	if d := take(t, s3, hit); d[0].Allowed || d[0].Remaining != 0 {
		t.Fatalf("after a PostgreSQL restart: %+v, want denied", d[0])
	}
	if n := srv.QueryInt(t, db, "SELECT count FROM ratelimitd_counters WHERE key = $1", hit.Key); n != 5 {
		t.Errorf("the row holds %d, want 5", n)
	}
}

// TestMonthBudgetPostPaid: a token budget per calendar month charged
// after the fact (always_charge, hits_addend = the tokens used) admits
// while the budget lasts; the charge that spends it is denied and still
// counted, and every later request of the spender is denied, also
// through a new Store.
func TestMonthBudgetPostPaid(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	s := newStore(t, srv, db)
	month := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: 30 * 24 * time.Hour, Calendar: algo.CalendarMonth, Multiplier: 1}
	key := "tokens/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	charge := func(s *postgres.Store, n int64) algo.Decision {
		return take(t, s, algo.Hit{Key: key, Limit: month, Cost: n, Charge: true})[0]
	}
	for i, want := range []int64{700, 400, 100} {
		if d := charge(s, 300); !d.Allowed || d.Remaining != want {
			t.Fatalf("charge %d: %+v, want allowed with %d remaining", i+1, d, want)
		}
	}
	if d := charge(s, 300); d.Allowed || d.Remaining != 0 {
		t.Fatalf("the charge over the budget: %+v, want denied with 0 remaining", d)
	}
	if n := srv.QueryInt(t, db, "SELECT count FROM ratelimitd_counters WHERE key = $1", key); n != 1200 {
		t.Fatalf("the month's count is %d, want 1200 (the overshoot is charged)", n)
	}
	s2 := newStore(t, srv, db)
	for _, st := range []*postgres.Store{s, s2} {
		if d := take(t, st, algo.Hit{Key: key, Limit: month, Cost: 1})[0]; d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("the spender's next request: %+v, want denied with a RetryAfter", d)
		}
	}
	// A refund (is_negative_hits) of the overshoot does not reopen the
	// budget: 1200 - 200 = 1000, still spent; 250 more do.
	if d := take(t, s, algo.Hit{Key: key, Limit: month, Cost: 200, Release: true})[0]; !d.Allowed || d.Remaining != 0 {
		t.Fatalf("refund of 200: %+v, want allowed with 0 remaining", d)
	}
	if d := take(t, s, algo.Hit{Key: key, Limit: month, Cost: 250, Release: true})[0]; d.Remaining != 250 {
		t.Fatalf("refund of 250 more: %+v, want 250 remaining", d)
	}
}

// TestUnsupportedKind: a token bucket hit is refused with
// CauseUnsupported, without calling PostgreSQL.
func TestUnsupportedKind(t *testing.T) {
	srv := pgtest.Start(t)
	s := newStore(t, srv, srv.CreateDB(t))
	_, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "k", Limit: algo.Limit{Kind: algo.TokenBucket, Rate: 1, Period: time.Hour}, Cost: 1}})
	var e *postgres.Error
	if !errors.As(err, &e) || e.Cause() != postgres.CauseUnsupported {
		t.Fatalf("err %v, want cause %s", err, postgres.CauseUnsupported)
	}
}

// TestSchemaNewerRefused: a database migrated by a newer binary is
// refused at New, with cause CauseSchema and ErrSchemaNewer.
func TestSchemaNewerRefused(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	s := newStore(t, srv, db)
	_ = s.Close()
	if v := srv.QueryInt(t, db, "SELECT version FROM ratelimitd_schema"); v != postgres.SchemaVersion {
		t.Fatalf("schema version %d, want %d", v, postgres.SchemaVersion)
	}
	srv.Exec(t, db, "UPDATE ratelimitd_schema SET version = $1", postgres.SchemaVersion+1)
	o := postgres.DefaultOptions()
	o.URL = srv.URL(db)
	_, err := postgres.New(context.Background(), o)
	var e *postgres.Error
	if !errors.Is(err, postgres.ErrSchemaNewer) || !errors.As(err, &e) || e.Cause() != postgres.CauseSchema {
		t.Fatalf("New on a newer schema: %v, want ErrSchemaNewer with cause %s", err, postgres.CauseSchema)
	}
}

// TestConcurrentNew: replicas starting together on an empty database
// migrate it once (the advisory lock), none fails.
func TestConcurrentNew(t *testing.T) {
	srv := pgtest.Start(t)
	db := srv.CreateDB(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			o := postgres.DefaultOptions()
			o.URL = srv.URL(db)
			s, err := postgres.New(context.Background(), o)
			if err == nil {
				_ = s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
