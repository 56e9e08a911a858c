// Package memcache is a ratelimitd store on memcached, for fixed windows
// only (envoyproxy/ratelimit's BACKEND_TYPE=memcache): each (key, window)
// is one memcached counter, created with ADD (expiring after the window)
// and counted with INCR, both atomic on the server. See docs/memcached.md
// for the semantics, in particular what all-or-nothing means across keys
// that memcached cannot update together.
//
// The package imports pkg/algo and the shared backend packages
// (pkg/backend/overlimit, breaker, causes), never pkg/service or
// pkg/policy: hit keys arrive built (policy.Set.Key) and the Store
// satisfies service.Store, service.Causer (its errors) and
// service.Healther.
package memcache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	gomemcache "github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
)

// Store decides fixed-window hits on memcached. It implements
// service.Store and service.Healther. Safe for concurrent use.
type Store struct {
	client  *gomemcache.Client
	servers *gomemcache.ServerList
	now     func() time.Time
	// slack is added to a counter's expiration (seconds): pinnedSlack
	// when Options.Now pins the clock, else 0.
	slack   int64
	timeout time.Duration

	opts    Options
	clk     clock            // the breaker's and the probe's (see clock)
	cache   *overlimit.Cache // nil: disabled (Options.LocalCacheSize 0)
	breaker *breaker.Breaker // see breaker.go
	// unhealthy is set by an outage error of a call or the probe and
	// cleared by the next success; warmed once anything succeeded.
	unhealthy atomic.Bool
	warmed    atomic.Bool
	// resolved is set once the server list holds servers (always for
	// Options.Addrs; for SRV after the first successful lookup).
	resolved atomic.Bool
	// nservers is how many servers the list holds (see guarded).
	nservers atomic.Int32

	stop chan struct{}
	wg   sync.WaitGroup // probe and SRV refresher
	bg   sync.WaitGroup // decisions whose caller gave up, finishing
	// refundErrors counts refunds (DECR) that failed: each leaves a
	// denied or failed request's units counted until its window ends.
	refundErrors atomic.Uint64
}

// New returns a Store for opts. It does not wait for memcached (the
// service starts while it is down): it resolves the servers once (the SRV
// record, or the host names of Addrs), and when that fails retries in the
// background every 100 ms, decisions failing with CauseRefused meanwhile;
// the health probe runs in the background. Errors come from invalid
// options only.
func New(opts Options) (*Store, error) {
	if opts.Clock == nil {
		return newWithClock(opts, bclock.System{})
	}
	return newWithClock(opts, opts.Clock)
}

// newWithClock is New on clk (see clock).
func newWithClock(opts Options, clk clock) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Store{
		servers: new(gomemcache.ServerList),
		now:     opts.Now,
		timeout: opts.Timeout,
		opts:    opts,
		clk:     clk,
		cache:   overlimit.New(opts.LocalCacheSize),
		breaker: breaker.New(breakerOptions(opts), breakerErrors, clk.Now),
		stop:    make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	} else {
		s.slack = pinnedSlack
	}
	s.client = gomemcache.NewFromSelector(s.servers)
	s.client.Timeout = opts.Timeout
	s.client.MaxIdleConns = opts.MaxIdleConns
	_ = s.resolve()
	if !s.resolved.Load() || opts.SRV != "" {
		s.wg.Add(1)
		go s.resolveLoop()
	}
	if opts.HealthInterval > 0 {
		s.wg.Add(1)
		go s.probeLoop()
	}
	return s, nil
}

// Close stops the probe and the SRV refresher, waits for decisions still
// finishing in the background (refunds: at most a few Timeouts) and closes
// the idle connections. Take must not be called afterwards.
func (s *Store) Close() error {
	close(s.stop)
	s.wg.Wait()
	s.bg.Wait()
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("memcache: close: %w", err)
	}
	return nil
}

// SupportedAlgorithms lists the algorithms the store decides:
// fixed_window only (memcached's INCR counts; it cannot keep a token
// bucket's TAT, a sliding window's two counters or a log atomically).
func SupportedAlgorithms() []algo.Kind { return []algo.Kind{algo.FixedWindow} }

// Algorithms is SupportedAlgorithms (service.AlgorithmLister): the config
// loader refuses rules of other algorithms when this store is the backend.
func (s *Store) Algorithms() []algo.Kind { return SupportedAlgorithms() }

// PenaltyBoxes is false (service.PenaltyBoxer): memcached cannot count a
// denial and start a block in the step that decides the limit (one incr
// per key, no script), so the config loader refuses `penalty:` on this
// backend.
func (s *Store) PenaltyBoxes() bool { return false }

// RefundFailures is the number of refunds (DECR of a denied or failed
// request's increments) that failed since the Store was created
// (ratelimitd_backend_refund_errors_total): each leaves those units
// counted until the window ends.
func (s *Store) RefundFailures() uint64 { return s.refundErrors.Load() }
