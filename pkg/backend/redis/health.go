package redis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// DefaultHealthInterval is Options.HealthInterval in DefaultOptions.
const DefaultHealthInterval = time.Second

// healthProbe keeps Store.Healthy and Store.BreakerState current without
// traffic. Every interval in which no call succeeded, or while a circuit
// is not closed, it sends one PING through the breaker as a request would
// (Cluster: to every master, see probeMasters), and the outcome is
// recorded like a call's. A PING that runs out of time while Redis
// answered (see judgeProbe) is slowness, not an outage: it counts for
// nothing and the next one gets twice the time. While PINGs fail and the
// circuit is still closed, the next one follows one Timeout later (250 ms
// after a proven outage), so that an idle Store opens its circuit about as
// fast as a busy one. Only a proven outage (provenOutage) makes the Store
// unhealthy before the circuit opens. At most one PING is in flight, in a
// goroutine of its own.
type healthProbe struct {
	interval time.Duration
	clock    clock     // the Store's
	epoch    time.Time // origin of lastOK (monotonic)
	// lastOK is when a call last succeeded, in ns since epoch; -1: never.
	lastOK atomic.Int64
	// slow multiplies the probe's timeouts: doubled (up to maxProbeSlow)
	// after a probe that ran out of time while Redis was answering
	// (errProbeSlow: a starved host), back to 1 after a success. Only the
	// loop's goroutine uses it.
	slow time.Duration

	ctx    context.Context // canceled by stop
	cancel context.CancelFunc
	once   sync.Once
	done   chan struct{} // closed when the loop has returned
}

// startHealth starts s's probe loop on the Store's clock (nothing when
// interval is 0).
func (s *Store) startHealth(interval time.Duration) {
	if interval <= 0 {
		return
	}
	clock := s.clk
	ctx, cancel := context.WithCancel(context.Background())
	h := &healthProbe{
		interval: interval,
		clock:    clock,
		epoch:    clock.Now(),
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	h.lastOK.Store(-1)
	s.health = h
	go s.healthLoop(h)
}

// stopHealth stops the probe loop and waits for it (at most one Timeout,
// the PING in flight is canceled). Safe to call more than once.
func (s *Store) stopHealth() {
	h := s.health
	if h == nil {
		return
	}
	h.once.Do(h.cancel)
	<-h.done
}

// callSucceeded notes that a call just succeeded (Redis answered).
func (s *Store) callSucceeded() {
	h := s.health
	if h == nil {
		return
	}
	n := int64(h.clock.Now().Sub(h.epoch))
	// Skip the shared write when it would move lastOK by under 1 ms: under
	// load, concurrent callers then mostly only read the cache line.
	if n-h.lastOK.Load() >= int64(time.Millisecond) {
		h.lastOK.Store(n)
	}
}

func (s *Store) healthLoop(h *healthProbe) {
	defer close(h.done)
	t := h.clock.NewTimer(h.interval)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C():
		}
		next := h.interval
		slow := max(1, h.slow)
		if !s.closed() {
			// A circuit opened: Redis may come back restarted (no
			// script, fresh pools), so warm again before serving.
			s.warmed.Store(false)
		}
		s.reloadFunctions(h.ctx, slow*max(s.timeout, probeTimeout))
		if s.needPing(h) {
			var err error
			switch {
			case !s.warmed.Load():
				err = s.probeMasters(h.ctx, slow*max(s.timeout, probeTimeout, s.dialTimeout), true)
				if err == nil {
					s.warmed.Store(true)
				}
			case s.writeRefused.Load():
				err = s.writeProbe(h.ctx, slow*max(s.timeout, probeTimeout))
			default:
				err = s.probeMasters(h.ctx, slow*max(s.timeout, probeTimeout), false)
				if err == nil {
					// A PING does not prove writes count (OOM, READONLY):
					// one decision on the probe keys does.
					err = s.writeProbe(h.ctx, slow*max(s.timeout, probeTimeout))
				}
			}
			switch {
			case errors.Is(err, errProbeSlow):
				h.slow = min(2*slow, maxProbeSlow)
			case err == nil:
				h.slow = 1
			}
			switch {
			case err == nil:
				s.probeFailed.Store(false)
			case provenOutage(err):
				s.probeFailed.Store(true)
			}
			if !errors.Is(err, ErrCircuitOpen) && !errors.Is(err, ErrStalledOpen) && h.ctx.Err() == nil {
				s.noteOutcome(err, false)
			}
			if isOutage(err) && s.closed() {
				// Not yet enough failures to open the circuit: confirm
				// soon; after a timeout at once, so that a silent Redis
				// opens the circuit (and health follows) about FailFor
				// after the first silent probe, as under traffic.
				next = max(s.timeout, probeTimeout)
				if !provenOutage(err) {
					next = s.timeout
				}
			}
		}
		if !s.Healthy() && next > recoveryPoll {
			// Not serving: look again soon, so that a Redis that came
			// back is counted again (and health says so) well within a
			// second, with or without traffic.
			next = recoveryPoll
		}
		t.Reset(next)
	}
}

// recoveryPoll is the probe's period while the Store is not healthy
// (circuit open or half-open, not warm, writes or credentials refused).
const recoveryPoll = 100 * time.Millisecond

// probeTimeout is the least time the health probe gives one PING (or a
// warm-up, or its write) before it counts as a failure. It is far more
// than Options.Timeout because a PING from an idle instance waits behind
// every other client's commands on a busy Redis; the breaker still needs
// Failures of them in a row.
const probeTimeout = 250 * time.Millisecond

// maxProbeSlow bounds healthProbe.slow: a warm-up probe gets at most
// 8 × max(probeTimeout, DialTimeout).
const maxProbeSlow = 8

// needPing reports whether the probe must act now: no call succeeded
// within the last interval, or the circuit is not closed, or the Store is
// not warm, or writes were refused.
func (s *Store) needPing(h *healthProbe) bool {
	if !s.closed() || !s.warmed.Load() || s.writeRefused.Load() {
		return true
	}
	last := h.lastOK.Load()
	return last < 0 || h.clock.Now().Sub(h.epoch)-time.Duration(last) >= h.interval
}

// writeProbe is one decision on s.probeKey (a fixed-window hit that
// expires within a second), within timeout: it succeeds only when the
// server counts again. Its outcome is recorded like a request's (run).
func (s *Store) writeProbe(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hits, err := s.probeHits(ctx)
	if err != nil {
		return Classify(err)
	}
	return Classify(s.Take(ctx, hits, make([]algo.Decision, len(hits))))
}

// probeHits are the write probe's hits: one on Options.ProbeKey
// (standalone, Sentinel), or on Cluster one per master, on the probe key
// with a hash tag in one of that master's slot ranges (CLUSTER SLOTS), so
// that every master is written.
func (s *Store) probeHits(ctx context.Context) ([]algo.Hit, error) {
	cc, ok := s.client.(*goredis.ClusterClient)
	if !ok {
		return []algo.Hit{{Key: s.probeKey, Limit: probeLimit, Cost: 1}}, nil
	}
	slots, err := cc.ClusterSlots(ctx).Result() //nolint:staticcheck // CLUSTER SHARDS needs Redis 7; CLUSTER SLOTS answers on every version
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var hits []algo.Hit
	for _, r := range slots {
		if len(r.Nodes) == 0 || seen[r.Nodes[0].Addr] {
			continue
		}
		seen[r.Nodes[0].Addr] = true
		if tag, ok := tagIn(r.Start, r.End); ok {
			hits = append(hits, algo.Hit{Key: s.probeKey + "{" + tag + "}", Limit: probeLimit, Cost: 1})
		}
	}
	return hits, nil
}

// tagIn is a hash tag whose slot is within [lo, hi] (the first of "0",
// "1", ... that is; false after 2^20 tries, which no range of a real
// Cluster needs).
func tagIn(lo, hi int) (string, bool) {
	for i := range 1 << 20 {
		t := strconv.Itoa(i)
		if sl := int(Slot(t)); sl >= lo && sl <= hi {
			return t, true
		}
	}
	return "", false
}

// probeLimit is the write probe's limit: never denies, keys expire within
// a second.
var probeLimit = algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 40, Period: time.Second}

// isOutage reports whether err (from Breaker.Do) is an outage failure.
func isOutage(err error) bool {
	var e *Error
	return err != nil && errors.As(err, &e) && e.Outage()
}

// provenOutage reports whether err, a probe's error, is an outage Redis
// proved at once: a refused or lost connection, LOADING, CLUSTERDOWN, an
// established stall. Such a probe makes the Store unhealthy before the
// circuit opens. A timeout proves nothing yet (a starved host, a short
// stall): it counts towards the circuit like a request's, so a silent
// Redis makes the Store unhealthy when the circuit opens, once the
// silence has lasted the breaker's FailFor, and a probe that was only
// slow leaves it healthy.
// On Cluster err joins the masters' errors: any one proven outage counts.
func provenOutage(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return slices.ContainsFunc(j.Unwrap(), provenOutage)
	}
	return isOutage(err) && CauseOf(err) != CauseTimeout
}
