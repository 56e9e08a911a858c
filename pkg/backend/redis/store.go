package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
)

// Store decides hits with the embedded script: each request (Cluster: each
// hash-slot group of a request) is one segment, and the segments of
// concurrent requests are decided together by one EVALSHA per flush. It
// implements service.Store and is safe for concurrent use.
//
// Each master has its own circuit breaker, stall detection and batcher
// (see master), so that a dead or frozen Cluster master fails only the
// groups of its own slots. Every call returns by min(the caller's
// deadline, Options.Timeout after it was queued), plus scheduling delay
// and at most one sweeper tick.
type Store struct {
	client goredis.UniversalClient
	// batch runs the script, pipelining concurrent requests and letting
	// each caller go at its own deadline. batch and breaker are those of
	// def, the master path on standalone and Sentinel; on Cluster def
	// serves keys whose master is unknown, and every master has its own.
	batch   *batcher
	breaker *Breaker
	def     *master
	// masters are the Cluster masters' paths by address (nil on
	// standalone and Sentinel), added as decisions reach them and kept
	// (a former master's stays idle); see masterFor.
	mastersMu sync.RWMutex
	masters   map[string]*master
	// live watches the sockets for the batchers (nil without New).
	live *liveness
	// login backs off the client's dials after a refused login (nil
	// without New).
	login   *loginGate
	clk     clock   // see clock
	opts    Options // for the batchers and breakers of new masters
	cluster bool
	now     func() time.Time // nil: the script uses the server's TIME
	timeout time.Duration    // Options.Timeout
	// dialTimeout is Options.DialTimeout: it bounds the probe's warm-ups
	// (dials, TLS handshakes, SCRIPT LOAD).
	dialTimeout time.Duration
	cache       *overlimit.Cache
	// credits keeps cache exact across replicas (nil without a cache, or
	// without New); see credits.go.
	credits             *credits
	creditPublishErrors atomic.Uint64

	noncePrefix string
	seq         atomic.Uint64

	// windowKeys is Options.WindowKeys (each master keeps its estimate
	// of its clock: master.clock).
	windowKeys bool
	// leaseOffset estimates the server's clock less the local one (µs)
	// from the lease replies (Lease): the window the keys of the next
	// lease carry.
	leaseOffset atomic.Int64
	// born is Options.Now at New (µs) when the clock is pinned: the
	// lease script's born (see lease.lua); with the server's clock the
	// script reads it from INFO.
	born int64
	// leaseSlots bounds the Lease calls in flight at once to half the
	// pool (nil without newStore: unbounded); see Lease.
	leaseSlots chan struct{}

	// hints rank a Cluster request's slot groups (see takeCluster; nil
	// on standalone and Sentinel).
	hints *leadHints

	// refundErrors counts failed compensating refunds (Cluster only).
	refundErrors atomic.Uint64
	// bg tracks compensating refunds, which may outlive their Take.
	bg sync.WaitGroup
	// health PINGs Redis when no call succeeded lately (nil: disabled by
	// Options.HealthInterval 0); see healthProbe.
	health *healthProbe
	// refused is set when a call or PING failed with CauseAuth (the server
	// refused our credentials, ACL permissions, database index or
	// certificate) and cleared by the next success: see Healthy.
	refused atomic.Bool
	// writeRefused is set when a call failed because the server refused
	// to write (CauseOOM, CauseReadonly: nothing is being counted) and
	// cleared by the next decision that succeeds (a request's, or the
	// health probe's write probe on probeKey).
	writeRefused atomic.Bool
	// probeFailed is set when the health probe failed with a proven
	// outage (provenOutage: not a timeout) and cleared by the next success
	// (a probe's or a decision's): an idle Store reports a refused or lost
	// connection within one probe interval, before the circuit opens.
	probeFailed atomic.Bool
	// warmed is set once Warm or a decision succeeded, and cleared while
	// the circuit is open (the health probe warms again: pools, script).
	warmed   atomic.Bool
	probeKey string
	// sentinelMaster watches the Sentinel master's address (nil in other
	// modes).
	sentinelMaster *masterWatch
	// fnReloading: a reloadFunctions is running.
	fnReloading atomic.Bool
	// warmConns is how many connections per node Warm and the health
	// probe keep dialed: max(Options.MinIdleConns, pipelines + 1).
	warmConns int
}

// New returns a Store for opts (start from DefaultOptions). It does not
// wait for Redis: the client connects lazily, so the service starts while
// Redis is down. Unless Options.HealthInterval is 0 it starts the
// background health probe (see Healthy); Close stops it. Errors come from
// invalid options (Options.Validate) or unreadable TLS files only.
func New(opts Options) (*Store, error) {
	if opts.Clock == nil {
		return newWithClock(opts, bclock.System{})
	}
	return newWithClock(opts, opts.Clock)
}

// newWithClock is New on clk (see clock).
func newWithClock(opts Options, clk clock) (*Store, error) {
	var mw *masterWatch
	live := newLiveness(opts.Addrs, opts.Mode == Sentinel)
	live.now, live.epoch = clk.Now, clk.Now()
	live.timeout = opts.Timeout
	login := &loginGate{now: clk.Now}
	hooks := dialHooks{wrap: live.wrap, login: login}
	if opts.Mode == Sentinel {
		mw = newMasterWatch(opts.Addrs)
		hooks.watch = mw.dialed
	}
	c, err := newClient(opts, hooks) // validates opts
	if err != nil {
		return nil, err
	}
	s := newStore(c, opts, clk)
	s.login = login
	s.def.breaker.login = login
	s.sentinelMaster = mw
	s.live = live
	s.batch.live = live
	s.startCredits()
	s.startHealth(opts.HealthInterval)
	return s, nil
}

func newStore(c goredis.UniversalClient, opts Options, clk clock) *Store {
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &Store{
		client:      c,
		clk:         clk,
		now:         opts.Now,
		timeout:     opts.Timeout,
		dialTimeout: opts.DialTimeout,
		cache:       overlimit.New(opts.LocalCacheSize),
		noncePrefix: hex.EncodeToString(b[:]),
		probeKey:    opts.ProbeKey,
		opts:        opts,
		windowKeys:  opts.WindowKeys,
		leaseSlots:  make(chan struct{}, max(1, opts.PoolSize/2)),
	}
	if s.probeKey == "" {
		s.probeKey = DefaultProbeKey
	}
	if s.now != nil {
		s.born = s.now().UnixMicro()
	}
	if !opts.CacheUncharged {
		s.cache.WithoutUncharged()
	}
	_, s.cluster = c.(*goredis.ClusterClient)
	if s.cluster {
		s.masters = map[string]*master{}
		s.hints = newLeadHints(s.clock())
	}
	if s.windowKeys && s.hints == nil { // mixed requests take takeCluster's path
		s.hints = newLeadHints(s.clock())
	}
	s.def = s.newMaster("")
	s.batch, s.breaker = s.def.batch, s.def.breaker
	s.warmConns = min(max(opts.MinIdleConns, s.batch.pipelines+1), max(1, opts.PoolSize))
	return s
}

// Close stops the health probe, waits for the pipelines in flight (at most
// one Timeout) and closes the connection pool. Take must not be called
// afterwards (it then fails).
func (s *Store) Close() error {
	s.stopHealth()
	s.stopCredits()
	s.bg.Wait()
	for _, m := range s.paths() {
		m.batch.close()
	}
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("redis: close: %w", err)
	}
	return nil
}

// CacheHits is the number of local over-limit cache lookups that found a
// denial since the Store was created (envoyproxy/ratelimit's
// ratelimit.localcache.hitCount; 0 when the cache is disabled).
func (s *Store) CacheHits() uint64 { return s.cache.Hits() }

// CacheMisses is the number of local over-limit cache lookups that found
// no denial (envoyproxy/ratelimit's ratelimit.localcache.missCount; 0
// when the cache is disabled).
func (s *Store) CacheMisses() uint64 { return s.cache.Misses() }

// CacheEnabled reports whether the local over-limit cache is on
// (Options.LocalCacheSize > 0).
func (s *Store) CacheEnabled() bool { return s.cache != nil }

// ResetCache drops every entry of the local over-limit cache. Call it on a
// config reload so that no denial computed under an old limit survives.
func (s *Store) ResetCache() { s.cache.Reset() }

// MasterChanges is how many times the Sentinel master the Store writes to
// changed address (a failover; 0 in other modes): each is logged, and
// docs/redis-operations.md bounds the hits a failover may lose.
func (s *Store) MasterChanges() uint64 {
	if s.sentinelMaster == nil {
		return 0
	}
	return s.sentinelMaster.changes.Load()
}

// RefundErrors is the number of Cluster compensating refunds that failed
// (each one leaves a request's consumption in place until its keys reset).
func (s *Store) RefundErrors() uint64 { return s.refundErrors.Load() }

func (s *Store) nowUS() int64 {
	if s.now == nil {
		return -1
	}
	return s.now().UnixMicro()
}

// nonce is a request's unique id for the script (one allocation).
func (s *Store) nonce() string {
	var b [32]byte
	n := append(b[:0], s.noncePrefix...)
	n = strconv.AppendUint(n, s.seq.Add(1), 36)
	return string(n)
}

// Take decides all hits of one request atomically (see service.Store). On
// Cluster, hits are grouped by hash slot and the group most likely to deny
// is decided first, then the others in parallel; when a later group
// denies, a compensating refund reverses what the others consumed and do
// not keep (see takeCluster). Errors wrap the go-redis error, prefixed
// "redis:".
func (s *Store) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	if len(hits) == 0 {
		return nil
	}
	err := s.cache.Take(ctx, hits, out, s.clock, s.take)
	s.publishCredits(hits, func(h algo.Hit) bool { return h.Release })
	return err
}

// take decides hits on Redis (without the local cache) into out.
func (s *Store) take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	if s.opts.NativeCounting && slices.ContainsFunc(hits, func(h algo.Hit) bool { return nativeHit(&h) }) {
		return s.takeNative(ctx, hits, out)
	} else if !s.cluster && !s.mixed(hits) {
		_, err := s.run(ctx, modeTake, s.nowUS(), s.nonce(), hits, out)
		return err
	}
	return s.takeCluster(ctx, hits, out)
}

// Healthy reports whether decisions are being counted (service.Healther):
// the Store is warm, every current master's circuit is closed, and the
// server does not refuse the Store's configuration (CauseAuth) or writes
// (OOM, READONLY, NOREPLICAS); a refusal holds until the next success.
// Without traffic the health probe keeps it current, every
// Options.HealthInterval.
func (s *Store) Healthy() bool {
	return s.warmed.Load() && s.closed() && !s.refused.Load() && !s.writeRefused.Load() && !s.probeFailed.Load()
}

// noteOutcome keeps refused and writeRefused current from the classified
// outcome of a call or PING (nil: success). decision tells a decision
// (the script ran and counted) from a PING, which clears only refused.
func (s *Store) noteOutcome(err error, decision bool) {
	if err == nil {
		if s.refused.Load() {
			s.refused.Store(false)
		}
		if decision && s.writeRefused.Load() {
			s.writeRefused.Store(false)
		}
		return
	}
	switch CauseOf(err) {
	case CauseAuth:
		s.refused.Store(true)
	case CauseOOM, CauseReadonly:
		s.writeRefused.Store(true)
	}
}

// BreakerState is the circuit breaker's state now: "closed", "open" or
// "half_open" (the label of ratelimitd_backend_circuit_state). On Cluster
// each master has its own circuit and this is the worst of them (open,
// then half_open, then closed), former masters excluded. Kept current
// without traffic by the health probe, like Healthy.
func (s *Store) BreakerState() string {
	worst := BreakerClosed
	for _, m := range s.paths() {
		if !m.current.Load() {
			continue
		}
		switch st := m.breaker.State(); st {
		case BreakerOpen:
			return st.String()
		case BreakerHalfOpen:
			worst = st
		}
	}
	return worst.String()
}

func (s *Store) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}
