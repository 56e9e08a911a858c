package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// DefaultWarmup bounds Store.Warm at startup (ratelimitd's --redis-warmup).
const DefaultWarmup = 5 * time.Second

// warmRetry is the pause between two Warm attempts while Redis is not
// ready (down, loading, refusing).
const warmRetry = 50 * time.Millisecond

// Warm prepares the Store so that no request pays for connection setup:
// on every node that takes decisions (the standalone server, the Sentinel
// master, every Cluster master, whose slot map it loads) it dials
// max(Options.MinIdleConns, Options.Pipelines + 1) connections (the flush
// loops and the health probe) with a PING each, loads the scripts
// (SCRIPT LOAD, so that the first EVALSHA of each finds it) and, where
// the server and user allow it, window1Func's library (FUNCTION LOAD, so
// that lone window decisions go out as FCALL). It retries every 50 ms until it succeeds or ctx
// ends, and returns nil or the last error (classified). Warm never makes
// Redis required: a Store that was not warmed still decides, with the
// rules' failure modes while Redis is unreachable.
//
// Until Warm has succeeded once (or a decision has), Healthy is false:
// health says NOT_SERVING before anything can be counted. A script
// flushed by a restart or failover is sent again within the call
// that found it missing (EVAL after NOSCRIPT, inside the same budget).
// Afterwards the health probe PINGs the same connections every
// Options.HealthInterval when idle, which keeps them dialed and verified.
func (s *Store) Warm(ctx context.Context) error {
	// said is the latest error Redis itself answered (a refused AUTH, a
	// DB index out of range): when the warm-up runs out of time it is
	// the one to report, not the timeout that ended the last attempt, nor
	// the dial backoff that followed the refusal.
	var said error
	for {
		err := s.warmOnce(ctx)
		s.login.observe(err) // warmOnce bypasses the breakers, which report the others
		if err != nil {
			switch CauseOf(err) {
			case CauseTimeout, CauseStalled, CauseDeadline, CauseCanceled, CauseRefused, CauseReset:
			default:
				if errors.Is(err, ErrLoginBackoff) {
					break
				}
				said = err
			}
		}
		if err == nil {
			s.warmed.Store(true)
			// The local over-limit cache answers once its credit
			// subscription is confirmed; waiting for it keeps the first
			// requests' denials cacheable (up to Options.DialTimeout: a
			// subscription refused, e.g. by an ACL, leaves it off).
			wctx, cancel := context.WithTimeout(ctx, s.dialTimeout)
			_ = s.waitCredits(wctx)
			cancel()
			return nil
		}
		select {
		case <-ctx.Done():
			if said != nil {
				return Classify(said)
			}
			return Classify(err)
		case <-time.After(warmRetry):
		}
	}
}

// Warmed reports whether Warm (or a decision) has succeeded once.
func (s *Store) Warmed() bool { return s.warmed.Load() }

func (s *Store) warmOnce(ctx context.Context) error { return s.warmNodes(ctx, true) }

// warmNodes PINGs, on every node that takes decisions, s.warmConns
// connections at once (dialing those that are missing), and with script
// loads the script there (see warmNode).
func (s *Store) warmNodes(ctx context.Context, script bool) error {
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return s.warmNode(ctx, c, script)
		}) // loads the slot map first
	case *goredis.Client:
		return s.warmNode(ctx, c, script)
	default:
		return fmt.Errorf("redis: warm: unexpected client %T", s.client)
	}
}

// warmNode PINGs s.warmConns connections to the node of c at once
// (dialing those that are missing), and with script loads both scripts
// there. Every connection it dials is used at once, so none waits idle in
// the pool unverified (see dialer).
func (s *Store) warmNode(ctx context.Context, c *goredis.Client, script bool) error {
	conns := s.warmConns
	var wg sync.WaitGroup
	errs := make([]error, conns)
	cs := make([]*goredis.Conn, conns)
	for i := range conns {
		cs[i] = c.Conn()
		wg.Go(func() { errs[i] = cs[i].Ping(ctx).Err() })
	}
	wg.Wait()
	for _, cn := range cs {
		_ = cn.Close() // back to the pool, dialed
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if !script {
		return nil
	}
	for _, sc := range []struct {
		src string
		s   *goredis.Script
	}{{takeLua, takeScript}, {take1Lua, take1Script}, {windowLua, windowScript}, {window1Lua, window1Script}, {leanLua, leanScript}} {
		sha, err := c.ScriptLoad(ctx, sc.src).Result()
		if err != nil {
			return err
		}
		if sha != sc.s.Hash() {
			return fmt.Errorf("redis: SCRIPT LOAD returned %s, want %s", sha, sc.s.Hash())
		}
	}
	loadFunction(ctx, c, s.masterOf(c), s.clk.Now())
	return nil
}

// masterOf is the path of the master c is a client of.
func (s *Store) masterOf(c *goredis.Client) *master {
	if s.masters == nil {
		return s.def
	}
	return s.masterAt(c.Options().Addr)
}

// reloadFunctions loads window1Func again, in the background and within
// timeout, on the masters that answered "Function not found" or failed
// to load it (fnState.reload), and tries functions again on those that
// refused them FnRetry ago (fnState.due); the health probe calls it every
// tick, so that no request waits for it and a stalled master delays no
// probe.
func (s *Store) reloadFunctions(ctx context.Context, timeout time.Duration) {
	now := s.clk.Now()
	if !slices.ContainsFunc(s.paths(), func(m *master) bool { return m.fn.reload.Load() || m.fn.due(now) }) ||
		!s.fnReloading.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.fnReloading.Store(false)
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		s.reloadFunctionsOnce(ctx, now)
	}()
}

func (s *Store) reloadFunctionsOnce(ctx context.Context, now time.Time) {
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		_ = c.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			if m := s.masterOf(c); m.fn.reload.Load() || m.fn.due(now) {
				loadFunction(ctx, c, m, now)
			}
			return nil
		})
	case *goredis.Client:
		loadFunction(ctx, c, s.def, now)
	}
}

// errProbeSlow is the error of a health probe (PING, warm-up) that ran
// out of time while Redis was answering: a byte arrived from its master
// during the probe, or no socket to the master had a request unanswered
// for a Timeout with nothing received (see liveness), so ratelimitd, or a
// Redis starved with it, was too slow, not gone (a CPU-starved host, a
// throttled pod). Like ErrDeadline it is no outage and never opens the
// circuit: a slow probe on a starved host must not keep a Redis that
// answers counted as failed.
var errProbeSlow = newError(CauseDeadline, false, errors.New("redis: health probe not finished in time while redis was answering"))

// judgeProbe is err of a health probe of m that started at start, judged
// by whether Redis replied: a timeout is errProbeSlow when a byte was
// received from m since start (Redis answered part of the probe: the
// warm-up's many round trips did not fit a starved host's time slices),
// or else when no socket to m is stalled and the timeout was not a
// dial's; any other error stays as it is.
func (s *Store) judgeProbe(m *master, start time.Time, err error) error {
	if err == nil || s.live == nil || CauseOf(err) != CauseTimeout {
		return err
	}
	if s.live.heardSince(m.addr, start) {
		return errProbeSlow
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return err
	}
	if _, stalled := s.live.stalledAt(m.addr, s.timeout); stalled {
		return err
	}
	return errProbeSlow
}

// probeMasters is the health probe's warmNodes (script: a warm-up, else
// PINGs): each master through its own circuit breaker, as its requests
// would be (an open circuit is not called, a half-open one takes it as a
// probe, the outcome is recorded like a call's). On Cluster the slot map
// is loaded first, through def's breaker, and the masters it no longer
// names stop counting for Healthy and BreakerState (master.current). The
// error joins the masters' errors (nil: every master answered).
func (s *Store) probeMasters(ctx context.Context, timeout time.Duration, script bool) error {
	cc, ok := s.client.(*goredis.ClusterClient)
	if !ok {
		return s.breaker.Do(ctx, timeout, func(ctx context.Context) error {
			start := s.clk.Now()
			return s.judgeProbe(s.def, start, s.warmNodes(ctx, script))
		})
	}
	var mu sync.Mutex
	var clients []*goredis.Client
	err := s.breaker.Do(ctx, timeout, func(ctx context.Context) error {
		return cc.ForEachMaster(ctx, func(_ context.Context, c *goredis.Client) error {
			mu.Lock()
			clients = append(clients, c)
			mu.Unlock()
			return nil
		})
	})
	if err != nil {
		return err
	}
	addrs := make(map[string]bool, len(clients))
	for _, c := range clients {
		addrs[c.Options().Addr] = true
	}
	for _, m := range s.paths()[1:] {
		m.current.Store(addrs[m.addr])
	}
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		m := s.masterAt(c.Options().Addr)
		wg.Go(func() {
			errs[i] = m.breaker.Do(ctx, timeout, func(ctx context.Context) error {
				start := s.clk.Now()
				return s.judgeProbe(m, start, s.warmNode(ctx, c, script))
			})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
