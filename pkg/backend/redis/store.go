package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
)

// Store decides hits with the embedded script: each request (standalone,
// Sentinel) or each hash-slot group of a request (Cluster) is one segment,
// and the segments of concurrent requests are decided together by one
// EVALSHA per flush (Cluster: one per hash slot). It implements
// service.Store.
//
// On Cluster each master has its own circuit breaker, stall detection
// and batcher (see master), chosen per slot group from go-redis' slot
// map: a master that is dead or frozen fails (or sheds) the groups of its
// own slots only, and every other master's keys keep being decided and
// counted by Redis. Standalone and Sentinel have one of each (one
// master).
//
// Safe for concurrent use; at most Options.Pipelines flushes are in
// flight at a time (Cluster: per master), each on one pooled connection
// (see batcher), and every call returns by its deadline: min(the caller's
// context deadline, Options.Timeout after it was queued), plus scheduling
// delay, and for the Timeout plus at most one sweeper tick
// (min(1 ms, max(100 µs, Timeout/10))).
type Store struct {
	client goredis.UniversalClient
	// batch runs the script: it pipelines concurrent requests (one write
	// and one read syscall per batch instead of per request) and lets each
	// caller go at its own deadline.
	//
	// batch and breaker are those of def, the Store's master path: the
	// only one on standalone and Sentinel (one master); on Cluster the
	// path of the keys whose master is unknown (no slot map loaded),
	// while every master has its own (see masters).
	batch   *batcher
	breaker *Breaker
	def     *master
	// masters are the Cluster masters' paths by address (nil on
	// standalone and Sentinel), added as decisions reach them and kept
	// (a former master's stays idle); see masterFor.
	mastersMu sync.RWMutex
	masters   map[string]*master
	// live watches the sockets for the batchers (nil without New).
	live    *liveness
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
	// probeFailed is set when the health probe failed with an outage
	// error and cleared by the next success (a probe's or a decision's):
	// an idle Store reports unhealthy within one probe interval, before
	// enough failures opened the circuit.
	probeFailed atomic.Bool
	// warmed is set once Warm or a decision succeeded, and cleared while
	// the circuit is open (the health probe warms again: pools, script).
	warmed   atomic.Bool
	probeKey string
	// sentinelMaster watches the Sentinel master's address (nil in other
	// modes).
	sentinelMaster *masterWatch
	// noNX is set once a server refused PEXPIRE's NX (Redis 6; see
	// nativeCall): native calls then send PEXPIRE without it.
	noNX atomic.Bool
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
	var mw *masterWatch
	live := newLiveness(opts.Addrs, opts.Mode == Sentinel)
	live.timeout = opts.Timeout
	hooks := dialHooks{wrap: live.wrap}
	if opts.Mode == Sentinel {
		mw = newMasterWatch(opts.Addrs)
		hooks.watch = mw.dialed
	}
	c, err := newClient(opts, hooks) // validates opts
	if err != nil {
		return nil, err
	}
	s := newStore(c, opts)
	s.sentinelMaster = mw
	s.live = live
	s.batch.live = live
	s.startCredits()
	s.startHealth(opts.HealthInterval)
	return s, nil
}

func newStore(c goredis.UniversalClient, opts Options) *Store {
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &Store{
		client:      c,
		now:         opts.Now,
		timeout:     opts.Timeout,
		dialTimeout: opts.DialTimeout,
		cache:       overlimit.New(opts.LocalCacheSize),
		noncePrefix: hex.EncodeToString(b[:]),
		probeKey:    opts.ProbeKey,
		opts:        opts,
		windowKeys:  opts.WindowKeys,
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
		s.hints = newLeadHints()
	}
	if s.windowKeys && s.hints == nil { // mixed requests take takeCluster's path
		s.hints = newLeadHints()
	}
	s.def = s.newMaster("")
	s.batch, s.breaker = s.def.batch, s.def.breaker
	s.warmConns = min(max(opts.MinIdleConns, s.batch.pipelines+1), max(1, opts.PoolSize))
	return s
}

// master is the decision path of one Redis master (the standalone server,
// the Sentinel master, or one Cluster master): its circuit breaker and
// the batcher of the calls for its slots. Keeping them per master is what
// lets a Cluster master that is dead or frozen cost only its own keys:
// its failures and stalls open its circuit alone, its sockets alone look
// stalled (liveness.stalledAt), and its invocations hold only its own
// flush loops, while the other masters' decisions stay counted.
type master struct {
	addr    string // Cluster: "host:port" as the slot map names it; "" otherwise
	breaker *Breaker
	batch   *batcher
	// current is false from a probe that found the master no longer
	// serving slots (a former master) until a decision reaches it: it
	// then does not count for Healthy and BreakerState.
	current atomic.Bool
	// clock estimates the master's clock for window keys (Store.runOn).
	clock windowClock
}

// newMaster builds the path of the master at addr (see master).
func (s *Store) newMaster(addr string) *master {
	opts := s.opts
	pipelines := opts.Pipelines
	if pipelines == 0 {
		pipelines = DefaultPipelines
	}
	var m *master
	bo := breakerOptions(opts)
	// The circuit opening completes every call still waiting (see
	// batcher): the sweeper does that, so it is woken.
	next := bo.OnTransition
	bo.OnTransition = func(to BreakerState) {
		if next != nil {
			next(to)
		}
		if to == BreakerOpen {
			m.batch.kickSweeper()
		}
	}
	m = &master{addr: addr, breaker: NewBreaker(bo, nil)} // real clock: Options.Now pins only the script
	m.batch = newBatcher(s.client, min(pipelines, max(1, opts.PoolSize)), opts.Timeout, opts.MaxWait, opts.DeadlineMargin)
	m.batch.waitReplicas = opts.WaitReplicas
	m.batch.establish = establishAfter(opts)
	m.batch.overdue = func(sent time.Time) { m.breaker.Overdue(sent, m.breaker.now()) }
	m.batch.open = func() error { return m.breaker.OpenErr(m.breaker.now()) }
	m.batch.live, m.batch.liveAddr = s.live, addr
	m.batch.noNX = &s.noNX
	m.current.Store(true)
	m.clock.epoch = time.Now()
	return m
}

// masterFor is the path of the master serving key's slot (Cluster,
// from go-redis' slot map: no command is sent once it is loaded), or def
// on standalone and Sentinel, and on Cluster while no slot map can be
// loaded.
func (s *Store) masterFor(ctx context.Context, key string) *master {
	if s.masters == nil {
		return s.def
	}
	c, err := s.client.(*goredis.ClusterClient).MasterForKey(ctx, key)
	if err != nil {
		return s.def
	}
	return s.masterAt(c.Options().Addr)
}

// masterAt is the Cluster master path of addr, made on first use; a
// decision that reaches it makes it current again.
func (s *Store) masterAt(addr string) *master {
	s.mastersMu.RLock()
	m := s.masters[addr]
	s.mastersMu.RUnlock()
	if m != nil {
		if !m.current.Load() { // serving slots again
			m.current.Store(true)
		}
		return m
	}
	s.mastersMu.Lock()
	defer s.mastersMu.Unlock()
	if m = s.masters[addr]; m == nil {
		m = s.newMaster(addr)
		s.masters[addr] = m
	}
	return m
}

// paths is every master path the Store has: def, then the Cluster
// masters.
func (s *Store) paths() []*master {
	ms := []*master{s.def}
	s.mastersMu.RLock()
	for _, m := range s.masters {
		ms = append(ms, m)
	}
	s.mastersMu.RUnlock()
	return ms
}

// closed reports whether every current master's circuit is closed.
func (s *Store) closed() bool {
	for _, m := range s.paths() {
		if m.current.Load() && !m.breaker.Healthy() {
			return false
		}
	}
	return true
}

// breakerOptions are opts.Breaker with FailFor raised to 2 × Timeout (see
// BreakerOptions.FailFor): a stall of up to 3 timeouts never opens the
// circuit.
func breakerOptions(opts Options) BreakerOptions {
	b := opts.Breaker
	b.FailFor = max(b.FailFor, 2*opts.Timeout)
	return b
}

// establishAfter is how long a stall lasts before it is established and
// calls get ErrStalled (see batcher): the breaker's FailFor, when the
// circuit opens on it; at least Timeout.
func establishAfter(opts Options) time.Duration {
	return max(opts.Timeout, breakerOptions(opts).FailFor)
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
// ratelimit.localcache.hitCount; 0 when the cache is disabled). Each such
// hit's decision is answered from the cache (algo.Decision.FromCache)
// unless its request also needs the backend for a hit whose denial would
// deny the others (see Take).
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

// Take decides all hits of one request atomically (see service.Store):
// when the request is denied only its kept hits (algo.Hit.Kept: refunds,
// always_charge) are written. On Cluster, hits are grouped by hash slot;
// the group most likely to deny is decided first, then the others (in
// parallel: denied mode when the first denied, takes otherwise); when a
// later group denies, what the groups that allowed consumed and do not
// keep is reversed by a compensating refund (see takeCluster, and
// docs/redis.md for the bounded transient). A refund hit first
// drops its key from the local over-limit cache. Errors wrap the go-redis
// error, prefixed "redis:".
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

// Healthy reports whether the circuit breaker is closed (Redis answered
// recently; Cluster: every master's breaker, so that one master down makes
// the Store unhealthy although the others' keys are counted); it
// implements service.Healther. Without traffic it follows
// the health probe's PINGs (every Options.HealthInterval): it turns false
// about one interval after Redis stops answering (plus Failures PINGs one
// Timeout apart, FailFor for timeouts) and true again about one interval
// after Redis answers (plus Breaker.OpenFor, and go-redis' 1 s redial
// after PoolSize failed dials).
//
// It is also false while the server refuses the Store's configuration:
// from a call or PING that failed with CauseAuth (WRONGPASS, NOAUTH,
// NOPERM, a database index the server does not have, an untrusted server
// certificate) until the next call or PING that succeeds. Such replies
// come fast from a live server, so they do not open the circuit (each
// request still asks Redis and gets its failure mode), but the backend is
// not serving. Without traffic the probe's PING keeps this current; an
// ACL that allows PING but refuses EVALSHA makes it alternate with the
// probe (one interval each way).
//
// It is false until the Store is warm (Warm, or a first decision,
// succeeded: see Warm), and while decisions are refused by a live server
// that will not write (OOM under maxmemory with noeviction, READONLY or
// NOREPLICAS): from such a failed call until a decision succeeds again,
// which without traffic the probe tries once per interval with a write
// on Options.ProbeKey. Healthy is true only while decisions are counted.
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

// run decides hits (all in one slot on Cluster) as one segment of a
// batched script invocation of their master's path (masterFor), under
// that master's circuit breaker and
// Options.Timeout (enforced by the batcher's sweeper, not by a timer per
// call: see batcher). Errors are classified (*Error with a Cause): the
// invocation's error, or this segment's SegmentError, or ErrCallTimeout.
func (s *Store) run(ctx context.Context, mode string, nowUS int64, nonce string, hits []algo.Hit, out []algo.Decision) (int64, error) {
	m := s.def
	if len(hits) > 0 {
		m = s.masterFor(ctx, hits[0].Key)
	}
	return s.runOn(ctx, m, segment{mode: mode, nowUS: nowUS, nonce: nonce, hits: hits}, out)
}

// runOn decides seg on master m's path (see run).
func (s *Store) runOn(ctx context.Context, m *master, seg segment, out []algo.Decision) (int64, error) {
	start := m.breaker.now()
	if err := m.breaker.Allow(start); err != nil {
		return 0, err
	}
	nowUS := seg.nowUS
	seg.window = !seg.native && s.windowKeys && len(seg.hits) > 0 && windowKind(&seg.hits[0])
	seg.lean = !seg.native && s.windowKeys && len(seg.hits) > 0 && leanKind(&seg.hits[0])
	var scriptNow, sent int64
	var err error
	for try := 0; ; try++ {
		if (seg.window || seg.lean) && nowUS < 0 && try == 0 {
			seg.estUS, sent, seg.check = m.clock.now()
		}
		scriptNow, err = m.batch.do(ctx, seg, out)
		// A checked window call and every lean call (lean.lua reads the
		// server's TIME) refresh the master's clock estimate.
		if (seg.window && seg.check || seg.lean) && nowUS < 0 {
			if scriptNow > 0 && (err == nil || errors.Is(err, errStaleWindow)) {
				m.clock.observe(scriptNow, sent)
			} else if seg.check {
				m.clock.failed()
			}
		}
		// A checked window segment whose keys were not the server's
		// window (an estimate not yet verified, or a window boundary in
		// between) wrote nothing: again with the server's now, checked.
		// A boundary passes at most once per window, so a third refusal
		// is a clock that moved back.
		if !errors.Is(err, errStaleWindow) || try == 2 {
			break
		}
		seg.estUS, seg.check, sent = scriptNow, true, m.clock.mono()
	}
	if errors.Is(err, errStaleWindow) {
		err = fmt.Errorf("%w: the server's clock moved back", errReply)
	}
	err = Classify(err)
	m.breaker.record(start, m.breaker.now(), err)
	s.noteOutcome(err, true)
	if err == nil {
		s.callSucceeded()
		if !s.warmed.Load() {
			s.warmed.Store(true)
		}
		if s.probeFailed.Load() {
			s.probeFailed.Store(false)
		}
	}
	return scriptNow, err
}

// mixed reports whether hits mix window keys with other hits
// (Options.WindowKeys): they go to two scripts, decided all-or-nothing as
// a Cluster request's slot groups are (takeCluster).
func (s *Store) mixed(hits []algo.Hit) bool {
	if !s.windowKeys {
		return false
	}
	w := s.scriptOf(&hits[0])
	for i := 1; i < len(hits); i++ {
		if s.scriptOf(&hits[i]) != w {
			return true
		}
	}
	return false
}

// group is the hits of one hash slot within a request.
type group struct {
	idx   []int // positions in the request
	hits  []algo.Hit
	out   []algo.Decision
	nowUS int64
	nonce string
	err   error
}

// denied reports whether the group denied the request: a hit that is not
// Soft was denied (the script then wrote nothing).
func (g *group) denied() bool {
	for i, d := range g.out {
		if !d.Allowed && !g.hits[i].Soft {
			return true
		}
	}
	return false
}

// takeCluster decides hits on a Cluster: one script call per hash slot
// group, all-or-nothing across groups. The group most likely to deny
// (leadScore) goes first, alone: when it denies, the request is denied
// and the other groups are decided as denied (modeDenied: they consume
// nothing, so no other request ever sees them held); when it allows, the
// others are taken in parallel and, when one of them denies or fails,
// what the allowed groups consumed is reversed by compensating refunds.
// It returns the groups' joined errors when some failed and none denied;
// when some failed and another denied, the request is denied whatever the
// failed ones would have said, and it returns a *causes.Partial with the
// decided hits' decisions and the failed hits' indexes.
func (s *Store) takeCluster(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	start := time.Now()
	bySlot := make(map[uint32]*group, 2)
	var groups []*group
	for i, h := range hits {
		sl := uint32(Slot(h.Key))
		sl |= s.scriptOf(&h) << 16
		g := bySlot[sl]
		if g == nil {
			g = &group{}
			bySlot[sl] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.hits = append(g.hits, h)
	}
	nonce := s.nonce()
	nowUS := s.nowUS()
	if len(groups) == 1 {
		_, err := s.run(ctx, modeTake, nowUS, nonce, hits, out)
		if err == nil {
			s.hints.note(hits, out, s.clock())
		}
		return err
	}
	now := s.clock()
	lead, best := 0, int64(0)
	for i, g := range groups {
		g.out = make([]algo.Decision, len(g.hits))
		g.nonce = nonce
		if sc := s.hints.leadScore(g.hits, now); i == 0 || sc < best {
			lead, best = i, sc
		}
	}
	groups[0], groups[lead] = groups[lead], groups[0]
	first, rest := groups[0], groups[1:]
	first.nowUS, first.err = s.run(ctx, modeTake, nowUS, nonce, first.hits, first.out)
	deadline := s.batch.epoch.Add(time.Duration(s.batch.budget(ctx, int64(start.Sub(s.batch.epoch)))))
	firstDenied := first.err == nil && first.denied()
	if firstDenied {
		s.decideDenied(ctx, deadline, nowUS, rest)
	} else {
		var wg sync.WaitGroup
		for _, g := range rest {
			wg.Go(func() {
				g.nowUS, g.err = s.run(ctx, modeTake, nowUS, nonce, g.hits, g.out)
			})
		}
		wg.Wait()
	}
	var errs []error
	denied := false
	for _, g := range groups {
		if g.err != nil {
			errs = append(errs, g.err)
			continue
		}
		s.hints.note(g.hits, g.out, now)
		if g.denied() {
			denied = true
		}
	}
	if !firstDenied && (denied || len(errs) > 0) {
		// A denial decides the request whatever the failed groups would
		// have said, so then the refunds' decisions are waited for as
		// for any denial; a failure without a denial uses none.
		s.compensate(ctx, deadline, groups, !denied)
	}
	if len(errs) > 0 && !denied {
		return errors.Join(errs...)
	}
	return collect(groups, out, errs)
}

// collect copies the decided groups' decisions into out. When errs is not
// empty (a group failed while a live master denied), it returns a
// causes.Partial: the decided hits are answered, the failed ones get their
// failure modes (service.PartialFailure), and the request stays denied.
func collect(groups []*group, out []algo.Decision, errs []error) error {
	var failed []int
	for _, g := range groups {
		if g.err != nil {
			failed = append(failed, g.idx...)
			continue
		}
		for j, i := range g.idx {
			out[i] = g.out[j]
		}
	}
	if len(errs) > 0 {
		slices.Sort(failed)
		return &causes.Partial{Decisions: out, Failed: failed, Err: errors.Join(errs...)}
	}
	return nil
}

// decideDenied decides groups, the rest of a request another group
// denied, in modeDenied: each writes only its kept hits (releases,
// always_charge) and reports the others as a denied request does (a check
// on the state before it). Like compensating refunds they run in the
// background under their own Timeout (kept hits are written even when
// the caller has gone; Close waits for them), and decideDenied waits for
// them until deadline or ctx's end: a group not decided by then gets
// ErrDeadline (or its own error), so its hits get their failure modes
// while the request stays denied.
func (s *Store) decideDenied(ctx context.Context, deadline time.Time, nowUS int64, groups []*group) {
	type decided struct {
		g     *group
		out   []algo.Decision
		nowUS int64
		err   error
	}
	done := make(chan decided, len(groups))
	for _, g := range groups {
		hits := g.hits
		s.bg.Go(func() {
			out := make([]algo.Decision, len(hits))
			n, err := s.run(context.WithoutCancel(ctx), modeDenied, nowUS, g.nonce, hits, out)
			done <- decided{g, out, n, err}
		})
	}
	for _, g := range groups {
		g.err = ErrDeadline
	}
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	for range groups {
		select {
		case d := <-done:
			d.g.out, d.g.nowUS, d.g.err = d.out, d.nowUS, d.err
		case <-wait.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// compensate reverses every group of a denied or failed request that
// consumed, so that the request consumes nothing. Each refund runs in the
// background under its own Timeout (it completes even when the caller has
// gone; Close waits for it). When the request failed, its decisions are
// not used and compensate does not wait. When it was denied, compensate
// waits for the refunds until deadline (the take's budget, see batcher) or
// ctx's end, whichever is first: the refund replies are the check-only
// decisions on the restored state (the values before the request) and
// replace the allowed groups' decisions. A refund that has not answered by
// then leaves those groups' take decisions (the remaining after the
// request) and still completes in the background.
func (s *Store) compensate(ctx context.Context, deadline time.Time, groups []*group, failed bool) {
	type refunded struct {
		g      *group
		checks []algo.Decision
	}
	done := make(chan refunded, len(groups))
	n := 0
	for _, g := range groups {
		if g.err != nil || g.denied() {
			continue
		}
		n++
		// Reverse only what the take consumed and the request does not
		// keep: a hit denied on its own (Soft) wrote nothing, and
		// releases and always_charge hits stay (algo.Hit.Kept).
		rh := make([]algo.Hit, len(g.hits))
		for j, h := range g.hits {
			if !g.out[j].Allowed || h.Kept() {
				h.Cost = 0
			}
			h.Release, h.Charge = false, false
			rh[j] = h
		}
		s.bg.Go(func() {
			checks := make([]algo.Decision, len(rh))
			if _, err := s.run(context.WithoutCancel(ctx), modeRefund, g.nowUS, g.nonce, rh, checks); err != nil {
				s.refundErrors.Add(1)
				checks = nil
			}
			s.publishCredits(rh, func(h algo.Hit) bool { return h.Cost > 0 })
			done <- refunded{g, checks}
		})
	}
	if failed || n == 0 {
		return
	}
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	for range n {
		select {
		case r := <-done:
			if r.checks == nil {
				continue
			}
			// Hits that did not deny report the value before the request;
			// a hit denied on its own (a check, or a second hit on a key)
			// and a kept hit keep their decision.
			for j, d := range r.g.out {
				if d.Allowed && !r.g.hits[j].Kept() {
					r.g.out[j] = r.checks[j]
				}
			}
		case <-wait.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

func (s *Store) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key,
// or of its hash tag (the bytes between the first '{' and the next '}',
// when non-empty), modulo 16384. Source: Redis Cluster specification,
// "Keys distribution model".
func Slot(key string) uint16 {
	if i := indexByte(key, '{'); i >= 0 {
		if j := indexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) & 16383
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(s string) uint16 {
	var c uint16
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crcTable[byte(c>>8)^s[i]]
	}
	return c
}
