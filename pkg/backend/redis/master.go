package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// master is the decision path of one Redis master (the standalone server,
// the Sentinel master, or one Cluster master): its circuit breaker and the
// batcher of the calls for its slots. Kept per master, a dead or frozen
// Cluster master opens only its own circuit, looks stalled alone and holds
// only its own flush loops.
type master struct {
	addr string // Cluster: "host:port" as the slot map names it; "" otherwise
	// name is how log lines name the master (see Store.masterName).
	name    string
	breaker *Breaker
	batch   *batcher
	// current is false from a probe that found the master no longer
	// serving slots (a former master) until a decision reaches it: it
	// then does not count for Healthy and BreakerState.
	current atomic.Bool
	// clock estimates the master's clock for window keys (Store.runOn).
	clock windowClock
	// fn is what the master has of window1Func (FCALL or EVALSHA).
	fn fnState
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
	// Its reports name the master: on Cluster one master may stall or
	// fail while the others answer.
	name := s.masterName(addr)
	if report := bo.OnReport; report != nil {
		bo.OnReport = func(r BreakerReport) {
			r.Node = name
			report(r)
		}
	}
	m = &master{addr: addr, name: name, breaker: NewBreaker(bo, s.clk.Now)} // Options.Now pins only the script
	m.breaker.login = s.login
	m.batch = newBatcher(s.client, min(pipelines, max(1, opts.PoolSize)), opts.Timeout, opts.MaxWait, opts.DeadlineMargin)
	m.batch.useClock(s.clk.Now)
	m.batch.waitReplicas = opts.WaitReplicas
	m.batch.establish = establishAfter(opts)
	m.batch.overdue = func(sent time.Time) { m.breaker.Overdue(sent, m.breaker.now()) }
	m.batch.open = func() error { return m.breaker.OpenErr(m.breaker.now()) }
	m.batch.live, m.batch.liveAddr = s.live, addr
	m.batch.fn, m.batch.fnName = &m.fn, m.name
	m.current.Store(true)
	m.clock.epoch = time.Now()
	return m
}

// masterName is how log lines name the master of the path at addr: a
// Cluster master's address; on Cluster the path of no master (addr "",
// the slot map's) by the seed nodes; the Sentinel master by its name
// (the failover watch logs its address as it changes); a standalone
// server by its address. Addresses hold no secret (credentials are in
// Options.URL's user info, never here).
func (s *Store) masterName(addr string) string {
	switch {
	case addr != "":
		return addr
	case s.cluster:
		return "cluster (seeds " + strings.Join(s.opts.Addrs, ",") + ")"
	case s.opts.Mode == Sentinel:
		return "sentinel master " + s.opts.MasterName
	}
	if c, ok := s.client.(*goredis.Client); ok {
		return c.Options().Addr
	}
	return "master"
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

// run decides hits (all in one slot on Cluster) as one segment of a
// batched invocation on their master's path (masterFor), under that
// master's circuit breaker and Options.Timeout. Errors are classified:
// the invocation's error, this segment's SegmentError, or ErrCallTimeout.
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
		return 0, m.errorOf(err)
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
	return scriptNow, m.errorOf(err)
}

// masterError is the error of a call on one master's path that is about
// that master (a timeout, its stall, its open circuit, a refused
// connection): it names the master, so that a log line of it tells
// which one on a Cluster where the others answer. It wraps the
// classified error: CauseOf, errors.Is and errors.As see through it.
type masterError struct {
	err  error
	name string
}

func (e *masterError) Error() string { return e.err.Error() + " (master " + e.name + ")" }
func (e *masterError) Unwrap() error { return e.err }

// errorOf is err naming m (masterError) when it is an outage or a
// refusal of m's circuit, err itself otherwise (nil, a reply of the
// server, a deadline of the caller).
func (m *master) errorOf(err error) error {
	var e *Error
	if err == nil || !errors.As(err, &e) {
		return err
	}
	if !e.Outage() && e.Cause() != CauseCircuitOpen && e.Cause() != CauseStalled {
		return err
	}
	return &masterError{err: err, name: m.name}
}
