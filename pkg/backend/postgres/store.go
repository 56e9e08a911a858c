// Package postgres is the durable ratelimitd store on PostgreSQL, for
// quotas over hours, days and months that must survive a Redis flush:
// fixed windows and sliding window counters (calendar months and years
// included), one row per key in ratelimitd_counters, decided by one call
// of the PL/pgSQL function ratelimitd_take per request (every hit of the
// request in one statement, with the rows locked and the server's clock),
// the concurrent requests of a process on the same keys batched in one
// transaction that the store commits once it has their decisions (see
// decide). See docs/postgres.md for the schema, sizing, backup and
// failover.
//
// The package imports pkg/algo and the shared backend packages
// (breaker, causes), never pkg/service or pkg/policy: hit keys arrive
// built, and the Store satisfies service.Store, service.Healther and
// service.AlgorithmLister, its errors service.Causer.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

// minConns is how many connections the pool keeps dialed at least.
const minConns = 4

// Store decides fixed-window and sliding-window hits on PostgreSQL. Safe
// for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	opts    Options
	secrets []string
	log     *slog.Logger
	clk     clock // the breaker's and the background loops' (see clock)
	breaker *breaker.Breaker
	// now, when set (tests), is the instant of every decision instead of
	// the server's clock.
	now func() time.Time

	// unhealthy is set by an outage error of a decision or the probe and
	// cleared by the next success.
	unhealthy atomic.Bool
	// answered is when PostgreSQL last answered a decision (Unix ns of
	// the wall clock).
	answered atomic.Int64
	// lastOutage is the latest outage error seen (see HealthCause).
	lastOutage atomic.Pointer[Error]
	// ready is set once the schema was checked or migrated (at New, or
	// later by connectLoop); until then Take answers notReady's error
	// without calling PostgreSQL.
	ready     atomic.Bool
	connected chan struct{} // closed when ready is set
	notReady  atomic.Pointer[Error]

	// repairFailed is set while repairSchema fails (logged once).
	repairFailed atomic.Bool

	// lanes queue the calls on each set of keys behind its in-flight
	// batch (see decide).
	lanesMu sync.Mutex
	lanes   map[string]*lane

	// refunded counts the takes reconcile released (see send);
	// reconciling is how many reconcile loops run.
	refunded    atomic.Uint64
	reconciling atomic.Int64
	// beforeCommit, when set (tests), runs before a batch's COMMIT.
	beforeCommit func()

	swept       atomic.Uint64
	sweepErrors atomic.Uint64

	stop      chan struct{}
	wake      chan struct{} // the probe's wake-up after an outage error (note)
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New connects to opt.URL and creates or migrates the schema (see
// SchemaVersion), within ctx, then starts the health probe and the
// sweeper. A database whose schema is newer than this binary's is
// refused with an error of cause CauseSchema, as is any error of a
// server that answered (a SQL error, a bad URL). When PostgreSQL cannot
// be reached (refused, timed out, the login refused, the database
// missing, TLS failed) New still returns the Store, not healthy: Take
// answers ErrNotConnected at once, and a background loop retries every
// unhealthyProbeInterval (after an auth or TLS error from 1 s doubling
// up to 30 s), each attempt bounded by ConnectTimeout, until the schema
// is checked; a newer schema
// found then keeps the Store unhealthy (Take answers cause CauseSchema)
// and is logged at error level once per outage. Errors never hold the
// password.
func New(ctx context.Context, opt Options) (*Store, error) {
	if opt.Clock == nil {
		return newWithClock(ctx, opt, bclock.System{})
	}
	return newWithClock(ctx, opt, opt.Clock)
}

// newWithClock is New on clk (see clock).
func newWithClock(ctx context.Context, opt Options, clk clock) (*Store, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	sec := opt.secrets()
	cfg, err := pgxpool.ParseConfig(opt.URL)
	if err != nil {
		return nil, classify(fmt.Errorf("URL %s: %w", RedactURL(opt.URL), err), sec)
	}
	if opt.Password != "" {
		cfg.ConnConfig.Password = opt.Password
	}
	cfg.MaxConns = opt.MaxConns
	// Session settings, set after connecting rather than as startup
	// parameters (which a connection pooler such as PgBouncer refuses):
	// a statement waits for a row lock at most Timeout on the server too
	// (a batch sets its own budget for its transaction, see send), so
	// that a session abandoned on a hot key's lock stops waiting; and
	// AsyncCommit.
	set := "SET lock_timeout = " + strconv.FormatInt(max(opt.Timeout.Milliseconds(), 1), 10)
	if opt.AsyncCommit {
		set += "; SET synchronous_commit = off"
	}
	// A few connections are dialed ahead, each warmed by a call with no
	// hits (the session parses ratelimitd_take once and prepares
	// takeSQL), so that the first decisions do not pay for it. Before
	// the schema exists the call fails; the connection is kept.
	cfg.MinConns = min(opt.MaxConns, minConns)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if _, err := c.Exec(ctx, set); err != nil {
			return err
		}
		var pe *pgconn.PgError
		_, err := c.Exec(ctx, takeSQL, nil, []string{}, []int32{}, []int32{}, []int64{}, []int64{}, []int32{}, []int64{}, []int64{}, []int32{})
		if err != nil && !errors.As(err, &pe) {
			return err
		}
		return nil
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "ratelimitd"
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, classify(err, sec)
	}
	s := &Store{
		pool:      pool,
		opts:      opt,
		secrets:   sec,
		log:       log,
		clk:       clk,
		stop:      make(chan struct{}),
		wake:      make(chan struct{}, 1),
		connected: make(chan struct{}),
		lanes:     make(map[string]*lane),
	}
	b := opt.Breaker
	b.FailFor = max(b.FailFor, 2*opt.Timeout)
	s.breaker = breaker.New(b, breakerErrors, clk.Now)
	if err := s.migrate(ctx); err != nil {
		if ctx.Err() != nil {
			err = errTimeout
		}
		var e *Error
		if !errors.As(err, &e) || !e.Outage() {
			pool.Close()
			return nil, err
		}
		s.notReady.Store(notConnected(err))
		s.lastOutage.Store(e)
		s.log.Warn("durable store: starting unhealthy, durable limits get their failure modes until PostgreSQL answers: "+connectAdvice(e.Cause()), "cause", e.Cause(), "err", err)
		s.wg.Add(1)
		go s.connectLoop(err)
	} else {
		s.setReady()
	}
	if opt.HealthInterval > 0 {
		s.wg.Add(1)
		go s.probeLoop()
	}
	if opt.SweepInterval > 0 {
		s.wg.Add(1)
		go s.sweepLoop()
	}
	return s, nil
}

// Close stops the probe and the sweeper and closes the pool (waiting for
// the connections in use). Take must not be called afterwards.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
		s.pool.Close()
	})
	return nil
}

// SupportedAlgorithms lists the algorithms the store decides:
// fixed_window and sliding_window (a row holds a window's count and the
// previous window's; a token bucket's or a log's state over hours has no
// use for quotas and no place in it).
func SupportedAlgorithms() []algo.Kind { return []algo.Kind{algo.FixedWindow, algo.SlidingWindow} }

// Algorithms is SupportedAlgorithms (service.AlgorithmLister).
func (s *Store) Algorithms() []algo.Kind { return SupportedAlgorithms() }

// BreakerState is the circuit breaker's state now: "closed", "open" or
// "half_open" (the label of the circuit-state gauge).
func (s *Store) BreakerState() string { return s.breaker.State().String() }

// Swept is the number of expired rows the sweeper deleted since New.
func (s *Store) Swept() uint64 { return s.swept.Load() }

// SweepErrors is the number of sweeper DELETEs that failed since New
// (each retried at the next sweep).
func (s *Store) SweepErrors() uint64 { return s.sweepErrors.Load() }
