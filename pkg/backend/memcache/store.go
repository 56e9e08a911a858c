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
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomemcache "github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
)

// maxRelativeExpiry is memcached's bound on a relative expiration time in
// seconds: a larger exptime is read as an absolute Unix time (memcached
// protocol.txt, "Expiration times").
const maxRelativeExpiry = 60 * 60 * 24 * 30

// expiryGrace is added to a counter's expiration: memcached's clock ticks
// in whole seconds, so a relative expiration may end up to one second
// early; the window's key changes at the window's end anyway, so a
// counter living a little longer costs memory only.
const expiryGrace = 2

// Store decides fixed-window hits on memcached. It implements
// service.Store and service.Healther. Safe for concurrent use.
type Store struct {
	client  *gomemcache.Client
	servers *gomemcache.ServerList
	now     func() time.Time
	timeout time.Duration

	opts    Options
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
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Store{
		servers: new(gomemcache.ServerList),
		now:     opts.Now,
		timeout: opts.Timeout,
		opts:    opts,
		cache:   overlimit.New(opts.LocalCacheSize),
		breaker: breaker.New(breakerOptions(opts), breakerErrors, nil), // real clock: Options.Now places hits only
		stop:    make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
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

// RefundFailures is the number of refunds (DECR of a denied or failed
// request's increments) that failed since the Store was created
// (ratelimitd_backend_refund_errors_total): each leaves those units
// counted until the window ends.
func (s *Store) RefundFailures() uint64 { return s.refundErrors.Load() }

// Healthy reports whether memcached is answering: true once a call or
// probe succeeded, false from an outage error (timeout, refused, no server
// resolved) of a call or probe until the next success, and false while
// the circuit breaker (one server only, see guarded) is not closed.
// Without traffic the
// probe asks every server for its version every Options.HealthInterval
// (every 100 ms while unhealthy), so one server of several down is
// unhealthy too: the keys it holds cannot be counted. Implements
// service.Healther.
func (s *Store) Healthy() bool {
	return s.warmed.Load() && !s.unhealthy.Load() && (!s.guarded() || s.breaker.Healthy())
}

func (s *Store) note(err error) {
	if err == nil {
		if !s.warmed.Load() {
			s.warmed.Store(true)
		}
		if s.unhealthy.Load() {
			s.unhealthy.Store(false)
		}
		return
	}
	var e *Error
	if errors.As(err, &e) && e.Outage() {
		s.unhealthy.Store(true)
	}
}

func (s *Store) probeLoop() {
	defer s.wg.Done()
	for {
		// While the circuit is closed the probe pings beside the
		// breaker (only decisions open it); while it is not, through
		// it: refused while open, a half-open probe after OpenFor that
		// closes it when memcached answers, so that an idle Store
		// recovers without traffic.
		var err error
		if !s.guarded() || s.breaker.Healthy() {
			err = s.ping()
		} else {
			err = s.breaker.Do(context.Background(), 0, func(context.Context) error { return s.ping() })
		}
		s.note(err)
		d := s.opts.HealthInterval
		if err != nil {
			d = min(d, unhealthyProbeInterval)
		}
		if !s.wait(d) {
			return
		}
	}
}

// wait waits d; it reports false, early, when the Store is closed.
func (s *Store) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.stop:
		return false
	case <-t.C:
		return true
	}
}

// ping asks every server for its version (each bounded by Timeout).
func (s *Store) ping() error {
	if !s.resolved.Load() {
		return newError(CauseRefused, true, gomemcache.ErrNoServers)
	}
	return Classify(s.client.Ping())
}

// resolveLoop resolves the servers again until it succeeded once (every
// unhealthyProbeInterval), then every Options.SRVRefresh (SRV only; 0:
// never).
func (s *Store) resolveLoop() {
	defer s.wg.Done()
	for {
		d := time.Duration(0)
		if s.opts.SRV != "" {
			d = s.opts.SRVRefresh
		}
		if !s.resolved.Load() && (d == 0 || d > unhealthyProbeInterval) {
			d = unhealthyProbeInterval
		}
		if d == 0 {
			return // resolved, no refresh
		}
		if !s.wait(d) {
			return
		}
		_ = s.resolve()
	}
}

// resolve installs the servers: Options.Addrs (their host names resolved
// now; a name that does not resolve yet is retried), or the targets of
// Options.SRV.
func (s *Store) resolve() error {
	if s.opts.SRV != "" {
		return s.refreshSRV()
	}
	if err := s.servers.SetServers(s.opts.Addrs...); err != nil {
		return fmt.Errorf("memcache: servers %s: %w", strings.Join(s.opts.Addrs, ","), err)
	}
	s.nservers.Store(int32(len(s.opts.Addrs)))
	s.resolved.Store(true)
	return nil
}

// refreshSRV resolves Options.SRV and installs its targets, sorted. A
// failed lookup (or one without targets) keeps the current list.
func (s *Store) refreshSRV() error {
	service, proto, name, err := parseSRV(s.opts.SRV)
	if err != nil {
		return err
	}
	lookup := s.opts.LookupSRV
	if lookup == nil {
		lookup = net.DefaultResolver.LookupSRV
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(s.timeout, time.Second))
	defer cancel()
	_, recs, err := lookup(ctx, service, proto, name)
	if err != nil {
		return fmt.Errorf("memcache: SRV lookup: %w", err)
	}
	addrs := ServersFromSRV(recs)
	if len(addrs) == 0 {
		return errors.New("memcache: SRV lookup: no targets")
	}
	if err := s.servers.SetServers(addrs...); err != nil {
		return fmt.Errorf("memcache: SRV targets: %w", err)
	}
	s.nservers.Store(int32(len(addrs)))
	s.resolved.Store(true)
	return nil
}

// ServersFromSRV turns SRV records into "host:port" strings (the target's
// trailing dot removed), sorted, so that every replica lists the servers
// in the same order and so selects the same server for a key.
func ServersFromSRV(recs []*net.SRV) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		if r == nil || r.Target == "" {
			continue
		}
		out = append(out, net.JoinHostPort(strings.TrimSuffix(r.Target, "."), strconv.Itoa(int(r.Port))))
	}
	sort.Strings(out)
	return out
}

// Servers returns the current server list as "host:port" strings, in
// selection order.
func (s *Store) Servers() []string {
	var out []string
	_ = s.servers.Each(func(a net.Addr) error {
		out = append(out, a.String())
		return nil
	})
	return out
}

// CounterKey is the memcached key of hit key k in the window starting at
// startUs (µs since the epoch): k + "_" + startUs, or, when that is not a
// legal memcached key (longer than 250 bytes, or holding spaces or control
// characters, as clear-text keys may), "rlmc1_" followed by the unpadded
// base64url of the first 128 bits of its SHA-256.
func CounterKey(k string, startUs int64) string {
	key := k + "_" + strconv.FormatInt(startUs, 10)
	if legalKey(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "rlmc1_" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// legalKey is memcached's key rule (gomemcache checks the same).
func legalKey(k string) bool {
	if len(k) > 250 || k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] == 0x7f {
			return false
		}
	}
	return true
}

// expiration is the memcached exptime of a counter whose window ends at
// endUs, seen at nowUs: the seconds left (rounded up) plus expiryGrace, as
// an absolute Unix time (from the real clock) beyond memcached's 30-day
// bound on relative times.
func expiration(nowUs, endUs int64) int32 {
	secs := (endUs-nowUs+999_999)/1_000_000 + expiryGrace
	if secs <= maxRelativeExpiry {
		return int32(secs)
	}
	return int32(min(time.Now().Unix()+secs, int64(1<<31-1)))
}

// budget is when a call started at start must return: start + Timeout, or
// earlier the caller's deadline less min(DeadlineMargin, a quarter of the
// time left).
func (s *Store) budget(ctx context.Context, start time.Time) time.Time {
	end := start.Add(s.timeout)
	if d, ok := ctx.Deadline(); ok {
		left := d.Sub(start)
		d = d.Add(-min(DeadlineMargin, left/4))
		if d.Before(end) {
			end = d
		}
	}
	return end
}

// request states: running, done (decide finished first), abandoned (the
// caller returned first).
const (
	reqRunning int32 = iota
	reqDone
	reqAbandoned
)

// request is one Take in flight.
type request struct {
	hits  []algo.Hit
	out   []algo.Decision
	err   error
	state atomic.Int32
	done  chan struct{}
}

// Take decides the hits of one request (see service.Store and
// docs/memcached.md): every hit must be a fixed_window limit. Each hit is
// one atomic INCR (ADD for a window's first hit) of its window's counter,
// admitted when the count it returns is within the limit; checks (cost 0)
// and hits whose cost exceeds the limit only read (GET). A hit that denies
// is decremented again at once; when any hit that is not Soft denies, the
// hits of the request that were admitted are decremented too (a
// compensating refund), so a denied request consumes nothing once the
// refunds are done, and their decisions report the counts before the
// request. Hits on different counters run in parallel, hits on one counter
// in order.
//
// Take returns by its budget (see budget) with an error of cause
// CauseTimeout when memcached has not answered; the operations still in
// flight finish in the background within Timeout each, and what they
// counted is refunded. Errors are *Error. With one server, while the
// circuit breaker is open (see breaker.go), Take returns ErrStalledOpen (memcached stalled)
// or ErrCircuitOpen (it refused connections) at once, without calling
// memcached.
//
// With the local over-limit cache (Options.LocalCacheSize > 0), every hit
// that is not a release is first looked up in it, in request order; a
// request whose hits are all cached denials is answered without memcached
// (algo.Decision.FromCache), and denials memcached returns for hits whose
// key occurs once in the request are cached until their RetryAfter (the
// window's end). See overlimit.Cache.Take for requests that mix cached
// and uncached hits.
func (s *Store) Take(ctx context.Context, hits []algo.Hit) ([]algo.Decision, error) {
	if len(hits) == 0 {
		return []algo.Decision{}, nil
	}
	for _, h := range hits {
		if h.Limit.Kind != algo.FixedWindow {
			return nil, newError(CauseUnsupported, false, fmt.Errorf("algorithm %d: only fixed_window is supported", h.Limit.Kind))
		}
	}
	return s.cache.Take(ctx, hits, s.now, s.take)
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

// take decides hits (all fixed_window) on memcached, without the local
// cache.
func (s *Store) take(ctx context.Context, hits []algo.Hit) ([]algo.Decision, error) {
	out := make([]algo.Decision, len(hits))
	start := time.Now()
	end := s.budget(ctx, start)
	if !end.After(start) {
		return nil, errTimeout
	}
	guarded := s.guarded()
	if guarded {
		if err := s.breaker.Allow(start); err != nil {
			return nil, err
		}
	}
	// decide may outlive the call (see below): it keeps its own copy of
	// hits, whose backing array the caller may reuse.
	r := &request{hits: append([]algo.Hit(nil), hits...), out: out, done: make(chan struct{})}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.decide(r)
	}()
	t := time.NewTimer(end.Sub(start))
	defer t.Stop()
	var err error
	select {
	case <-r.done:
		err = r.err
	case <-t.C:
		err = errTimeout
	case <-ctx.Done():
		err = Classify(ctx.Err())
	}
	if err != nil && !r.state.CompareAndSwap(reqRunning, reqAbandoned) {
		// decide finished meanwhile: its outcome stands.
		<-r.done
		err = r.err
	}
	// What the breaker records: the outcome, but a budget that the
	// caller's deadline cut short (or the caller's context that ran out)
	// is no proof of a stall.
	rec := err
	if errors.Is(err, errTimeout) && !end.Equal(start.Add(s.timeout)) || errors.Is(err, context.DeadlineExceeded) {
		rec = errBudgetCut
	}
	if guarded {
		s.breaker.RecordSince(start, time.Now(), rec)
	}
	if err != nil {
		if errors.Is(rec, errTimeout) {
			// memcached was silent for a whole Timeout. A budget cut
			// short by the caller's deadline proves less (the probe
			// decides then).
			s.note(err)
		}
		return nil, err
	}
	return r.out, nil
}

// taken records what decide counted for one hit.
type taken struct {
	key  string // counter key
	cost int64  // units counted by INCR and not refunded (0: none)
	// prev is the counter's value before this hit (the INCR's result
	// less cost, or the GET's value).
	prev  int64
	start int64 // window start, µs
	first int   // index of the request's first hit on this counter
	// kept: an always_charge hit (algo.Hit.Kept) whose cost stays counted
	// when the request is denied.
	kept bool
}

// decide runs the request's operations and sets r.out and r.err, then
// closes r.done. When the caller gave up first, everything counted is
// refunded.
func (s *Store) decide(r *request) {
	defer close(r.done)
	now := s.now()
	nowUs := now.UnixMicro()
	tk := make([]taken, len(r.hits))
	// Group the hits by counter: one goroutine per counter beyond the
	// first, hits of one counter in request order.
	groups := map[string][]int{}
	var order []string
	for i, h := range r.hits {
		st, _ := algo.WindowBoundsUs(h.Limit, nowUs)
		k := CounterKey(h.Key, st)
		tk[i] = taken{key: k, start: st, first: i}
		if g, ok := groups[k]; ok {
			tk[i].first = g[0]
		} else {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	errs := make([]error, len(order))
	run := func(gi int) {
		for _, i := range groups[order[gi]] {
			if r.state.Load() == reqAbandoned {
				errs[gi] = errAbandoned
				return
			}
			if err := s.decideHit(r.hits[i], now, nowUs, &tk[i], &r.out[i]); err != nil {
				errs[gi] = err
				return
			}
		}
	}
	if len(order) == 1 {
		run(0)
	} else {
		var wg sync.WaitGroup
		for gi := 1; gi < len(order); gi++ {
			wg.Go(func() { run(gi) })
		}
		run(0)
		wg.Wait()
	}
	var err error
	for _, e := range errs {
		if e != nil {
			err = e
			break
		}
	}
	denied := false
	for i, d := range r.out {
		if !d.Allowed && !r.hits[i].Soft {
			denied = true
		}
	}
	switch {
	case err == nil && !denied:
		if !r.state.CompareAndSwap(reqRunning, reqDone) {
			// The caller gave up (its failure mode applied): the request
			// consumes nothing.
			s.refundAll(tk, false)
		}
	case err == nil:
		// Denied: what the request counted is refunded, but for its
		// always_charge hits (refunds are never undone).
		s.refundAll(tk, true)
	default:
		s.refundAll(tk, false)
	}
	if err == nil && denied {
		// Hits that did not deny report the value before the request;
		// kept hits (refunds, always_charge) their own decision.
		for i, d := range r.out {
			if d.Allowed && !r.hits[i].Kept() {
				_, r.out[i] = algo.Take(r.hits[i].Limit, algo.State{Time: tk[i].start, Count: tk[tk[i].first].prev}, now, 0)
			}
		}
	}
	s.note(err)
	r.err = err
	r.state.CompareAndSwap(reqRunning, reqDone)
}

// refundAll decrements every counter by what the request counted on it,
// but for the kept (always_charge) hits when keepKept.
func (s *Store) refundAll(tk []taken, keepKept bool) {
	for i := range tk {
		if tk[i].cost > 0 && (!keepKept || !tk[i].kept) {
			if _, err := s.client.Decrement(tk[i].key, uint64(tk[i].cost)); err != nil && !errors.Is(err, gomemcache.ErrCacheMiss) {
				s.refundErrors.Add(1)
			}
			tk[i].cost = 0
		}
	}
}

// decideHit decides one hit: a read for checks and costs above the
// limit, else INCR (ADD on a new counter), decremented again when denied
// unless the hit is always_charge (algo.Charge: then also for costs
// above the limit). A refund (algo.Release) is a DECR, which memcached
// floors at 0 as algo.Release floors a fixed window's count, reported as
// an allowed check on the new value.
func (s *Store) decideHit(h algo.Hit, now time.Time, nowUs int64, t *taken, out *algo.Decision) error {
	l := h.Limit
	cost := algo.ClampCost(h.Cost)
	if h.Release {
		var v int64
		var err error
		if cost > 0 && l.Rate > 0 {
			v, err = s.decr(t.key, cost)
		} else {
			v, err = s.get(t.key)
		}
		if err != nil {
			return err
		}
		t.prev = v
		_, *out = algo.Take(l, algo.State{Time: t.start, Count: v}, now, 0)
		out.Allowed, out.RetryAfter = true, 0
		return nil
	}
	charge := h.Charge && l.Rate > 0
	if cost == 0 || (cost > l.Rate && !charge) {
		v, err := s.get(t.key)
		if err != nil {
			return err
		}
		t.prev = v
		_, *out = algo.Take(l, algo.State{Time: t.start, Count: v}, now, cost)
		return nil
	}
	_, end := algo.WindowBoundsUs(l, nowUs)
	v, err := s.incr(t.key, cost, expiration(nowUs, end))
	if err != nil {
		return err
	}
	prev := max(v-cost, 0)
	t.prev = prev
	var d algo.Decision
	if charge {
		_, d = algo.Charge(l, algo.State{Time: t.start, Count: prev}, now, cost)
	} else {
		_, d = algo.Take(l, algo.State{Time: t.start, Count: prev}, now, cost)
	}
	*out = d
	if d.Allowed || charge {
		t.cost, t.kept = cost, charge
		return nil
	}
	// Denied: this hit consumes nothing.
	if _, err := s.client.Decrement(t.key, uint64(cost)); err != nil && !errors.Is(err, gomemcache.ErrCacheMiss) {
		s.refundErrors.Add(1)
	}
	return nil
}

// decr subtracts n from a counter (memcached floors it at 0) and returns
// its new value; an absent counter stays absent (0).
func (s *Store) decr(key string, n int64) (int64, error) {
	v, err := s.client.Decrement(key, uint64(n))
	if errors.Is(err, gomemcache.ErrCacheMiss) {
		return 0, nil
	}
	if err != nil {
		return 0, Classify(err)
	}
	return int64(min(v, uint64(algo.MaxExact))), nil
}

// get reads a counter (0 when absent).
func (s *Store) get(key string) (int64, error) {
	it, err := s.client.Get(key)
	if errors.Is(err, gomemcache.ErrCacheMiss) {
		return 0, nil
	}
	if err != nil {
		return 0, Classify(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(it.Value)), 10, 64)
	if err != nil {
		return 0, newError(CauseOther, false, errors.New("counter value is not a number"))
	}
	return int64(min(n, uint64(algo.MaxExact))), nil
}

// incr adds cost to a counter atomically and returns its new value: INCR,
// or ADD with the expiration when the counter does not exist, or INCR
// again when another caller's ADD won the race.
func (s *Store) incr(key string, cost int64, exp int32) (int64, error) {
	for range 3 {
		v, err := s.client.Increment(key, uint64(cost))
		if err == nil {
			return int64(min(v, uint64(algo.MaxExact))), nil
		}
		if !errors.Is(err, gomemcache.ErrCacheMiss) {
			return 0, Classify(err)
		}
		err = s.client.Add(&gomemcache.Item{Key: key, Value: []byte(strconv.FormatInt(cost, 10)), Expiration: exp})
		if err == nil {
			return cost, nil
		}
		if !errors.Is(err, gomemcache.ErrNotStored) {
			return 0, Classify(err)
		}
		// Another caller created it first: INCR again.
	}
	return 0, newError(CauseOther, false, errors.New("counter vanished between ADD and INCR three times"))
}
