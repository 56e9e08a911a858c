package memcache_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
)

// testTimeout is generous: the assertions are about counts, not latency.
const testTimeout = 2 * time.Second

func newStore(t testing.TB, addrs []string, now func() time.Time) *memcache.Store {
	t.Helper()
	o := memcache.DefaultOptions()
	o.Addrs = addrs
	o.Timeout = testTimeout
	o.Now = now
	return openStore(t, o)
}

// probedStore is a store on srv with timeout whose health probe runs
// every 50 ms of a clock the test moves (tickUntil).
func probedStore(t testing.TB, srv *memcachetest.Server, timeout time.Duration) (*memcache.Store, *clock.Manual) {
	t.Helper()
	o := memcache.DefaultOptions()
	o.Addrs = []string{srv.Addr()}
	o.Timeout = timeout
	o.HealthInterval = 50 * time.Millisecond
	clk := clock.NewManual()
	s, err := memcache.NewOnClock(o, clk)
	if err != nil {
		t.Fatalf("memcache.NewOnClock: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, clk
}

// openStore returns memcache.New(o), failing t on an error, closed when
// t ends.
func openStore(t testing.TB, o memcache.Options) *memcache.Store {
	t.Helper()
	s, err := memcache.New(o)
	if err != nil {
		t.Fatalf("memcache.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// pinned is a settable clock.
type pinned struct{ us atomic.Int64 }

func newPinned(t time.Time) *pinned { p := &pinned{}; p.us.Store(t.UnixMicro()); return p }
func (p *pinned) Now() time.Time    { return time.UnixMicro(p.us.Load()) }
func (p *pinned) Advance(d time.Duration) {
	p.us.Add(d.Microseconds())
}

var fixed = func(rate int64, period time.Duration) algo.Limit {
	return algo.Limit{Kind: algo.FixedWindow, Rate: rate, Period: period}
}

func take(t *testing.T, s *memcache.Store, hits ...algo.Hit) []algo.Decision {
	t.Helper()
	d, err := algotest.Take(context.Background(), s, hits)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	return d
}

func uniq(t *testing.T) string {
	return strings.ReplaceAll(t.Name(), "/", ".") + "." + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// fixedTables are the conformance tables of pkg/algo that a store with
// one counter per (key, window) can pass: fixed_window hits only, and no
// step after the clock went back into an earlier window (the memory and
// Redis stores keep counting in the later window then; this store counts
// in the window the clock names, as envoyproxy/ratelimit does).
func fixedTables() []algotest.Table {
	var out []algotest.Table
	for _, tb := range algotest.Tables() {
		var steps []algotest.Step
		var last time.Time
		for _, st := range tb.Steps {
			at := algotest.Base.Add(st.At)
			if !st.Abs.IsZero() {
				at = st.Abs
			}
			if at.Before(last) {
				break
			}
			last = at
			ok := true
			for _, h := range st.Hits {
				ok = ok && h.Limit.Kind == algo.FixedWindow && !h.Penalty.On() // the store refuses penalty boxes
			}
			if ok {
				steps = append(steps, st)
			}
		}
		if len(steps) > 0 {
			out = append(out, algotest.Table{Name: tb.Name, Steps: steps})
		}
	}
	return out
}

// TestConformance runs the fixed-window conformance tables against a real
// memcached, with the store's clock pinned to the suite's.
func TestConformance(t *testing.T) {
	srv := memcachetest.Start(t)
	tables := fixedTables()
	names := map[string]bool{}
	for _, tb := range tables {
		names[tb.Name] = true
	}
	for _, want := range []string{"fixed_window", "fixed_window_multiplier", "fixed_window_same_instant", "calendar_month", "calendar_year", "rate_zero", "multi_hit", "fractional_refill_fixed_window"} {
		if !names[want] {
			t.Fatalf("table %s missing from the fixed-window subset", want)
		}
	}
	algotest.RunTables(t, tables, func(t *testing.T, now func() time.Time) algotest.Store {
		return newStore(t, []string{srv.Addr()}, now)
	})
}

// Algorithms other than fixed_window are refused by the store itself too
// (config loading refuses them first).
func TestUnsupportedAlgorithm(t *testing.T) {
	srv := memcachetest.Start(t)
	s := newStore(t, []string{srv.Addr()}, nil)
	if got := s.Algorithms(); len(got) != 1 || got[0] != algo.FixedWindow {
		t.Fatalf("Algorithms() = %v, want [FixedWindow]", got)
	}
	_, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: uniq(t), Limit: algo.Limit{Kind: algo.TokenBucket, Rate: 1, Period: time.Second}, Cost: 1}})
	var c interface{ Cause() string }
	if !errors.As(err, &c) || c.Cause() != memcache.CauseUnsupported {
		t.Fatalf("token bucket hit: err %v, want cause %q", err, memcache.CauseUnsupported)
	}
}

// concurrentAllowed is algotest.ConcurrentAllowed on stores (a Take
// error fails t): how many of n cost-1 requests on key were allowed.
func concurrentAllowed(t *testing.T, stores []*memcache.Store, key string, l algo.Limit, n int) int {
	t.Helper()
	allowed, err := algotest.ConcurrentAllowed(context.Background(), stores, key, l, n)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	return int(allowed)
}

// Exactness: goroutines over several Store instances on one counter admit
// exactly the limit, with and without a first ADD race (the counter is
// new for every run).
func TestExactUnderConcurrency(t *testing.T) {
	srv := memcachetest.Start(t)
	stores := []*memcache.Store{newStore(t, []string{srv.Addr()}, nil), newStore(t, []string{srv.Addr()}, nil), newStore(t, []string{srv.Addr()}, nil)}
	l := fixed(40, time.Hour)
	for run := range 3 {
		key := fmt.Sprintf("%s.%d", uniq(t), run)
		if n := concurrentAllowed(t, stores, key, l, 120); n != 40 {
			t.Fatalf("run %d: allowed %d of 120, want exactly 40", run, n)
		}
		// Nothing more fits; every denial consumed nothing.
		d := take(t, stores[0], algo.Hit{Key: key, Limit: l, Cost: 0})
		if d[0].Allowed || d[0].Remaining != 0 {
			t.Fatalf("run %d: check after the burst %+v, want denied with 0 remaining", run, d[0])
		}
	}
}

// helperEnv runs TestHelperProcess as a worker: it takes cost-1 hits on
// one key and prints how many were allowed.
const helperEnv = "RATELIMITD_MEMCACHE_HELPER"

func TestHelperProcess(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		return // not a worker: nothing to do
	}
	parts := strings.Split(spec, "|") // addr|key|rate|n
	rate, _ := strconv.ParseInt(parts[2], 10, 64)
	n, _ := strconv.Atoi(parts[3])
	s := newStore(t, []string{parts[0]}, nil)
	got := concurrentAllowed(t, []*memcache.Store{s}, parts[1], fixed(rate, time.Hour), n)
	fmt.Printf("allowed=%d\n", got)
}

// Exactness across processes: three processes of this test binary, each
// with its own Store and 16 goroutines, share one counter.
func TestExactAcrossProcesses(t *testing.T) {
	srv := memcachetest.Start(t)
	key := uniq(t)
	const procs, each, rate = 3, 40, 50
	var wg sync.WaitGroup
	totals := make([]int, procs)
	errs := make([]error, procs)
	for p := range procs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d|%d", helperEnv, srv.Addr(), key, rate, each))
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs[p] = fmt.Errorf("worker %d: %v\n%s", p, err, out)
				return
			}
			for _, line := range strings.Split(string(out), "\n") {
				if v, ok := strings.CutPrefix(line, "allowed="); ok {
					totals[p], _ = strconv.Atoi(v)
					return
				}
			}
			errs[p] = fmt.Errorf("worker %d printed no count:\n%s", p, out)
		})
	}
	wg.Wait()
	sum := 0
	for p := range procs {
		if errs[p] != nil {
			t.Fatal(errs[p])
		}
		sum += totals[p]
	}
	if sum != rate {
		t.Fatalf("processes allowed %v = %d of %d, want exactly %d", totals, sum, procs*each, rate)
	}
}

// hits_addend: a cost counts that many units; a cost that does not fit
// is denied and consumes nothing, so a smaller one still passes.
func TestHitsAddend(t *testing.T) {
	srv := memcachetest.Start(t)
	s := newStore(t, []string{srv.Addr()}, nil)
	k, l := uniq(t), fixed(10, time.Hour)
	for i, want := range []int64{7, 4, 1} {
		d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 3})
		if !d[0].Allowed || d[0].Remaining != want {
			t.Fatalf("take %d of cost 3: %+v, want allowed with %d remaining", i, d[0], want)
		}
	}
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 3}); d[0].Allowed || d[0].Remaining != 1 {
		t.Fatalf("cost 3 with 1 left: %+v, want denied with 1 remaining", d[0])
	}
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: algo.MaxCost}); d[0].Allowed || d[0].Remaining != 1 {
		t.Fatalf("cost 2^53: %+v, want denied with 1 remaining", d[0])
	}
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1}); !d[0].Allowed || d[0].Remaining != 0 {
		t.Fatalf("cost 1 with 1 left: %+v, want allowed with 0 remaining", d[0])
	}
}

// A request whose second descriptor denies consumes nothing on the
// first's counter (the compensating refund), and its allowed hits report
// the values before the request.
func TestAllOrNothingAcrossCounters(t *testing.T) {
	srv := memcachetest.Start(t)
	s := newStore(t, []string{srv.Addr()}, nil)
	a, b := uniq(t)+".a", uniq(t)+".b"
	la, lb := fixed(5, time.Hour), fixed(1, time.Hour)
	d := take(t, s, algo.Hit{Key: a, Limit: la, Cost: 2}, algo.Hit{Key: b, Limit: lb, Cost: 1})
	if !d[0].Allowed || !d[1].Allowed || d[0].Remaining != 3 {
		t.Fatalf("first request %+v, want both allowed, a with 3 remaining", d)
	}
	for range 3 {
		d = take(t, s, algo.Hit{Key: a, Limit: la, Cost: 2}, algo.Hit{Key: b, Limit: lb, Cost: 1})
		if !d[0].Allowed || d[1].Allowed {
			t.Fatalf("request with b exhausted %+v, want a not denying and b denied", d)
		}
		if d[0].Remaining != 3 {
			t.Fatalf("a reports %d remaining, want 3 (the value before the request)", d[0].Remaining)
		}
	}
	if d := take(t, s, algo.Hit{Key: a, Limit: la, Cost: 0}); d[0].Remaining != 3 {
		t.Fatalf("a after three denied requests: %d remaining, want 3 (nothing consumed)", d[0].Remaining)
	}
	// A Soft hit that denies does not deny the request: the others count.
	d = take(t, s, algo.Hit{Key: a, Limit: la, Cost: 1}, algo.Hit{Key: b, Limit: lb, Cost: 1, Soft: true})
	if !d[0].Allowed || d[1].Allowed || d[0].Remaining != 2 {
		t.Fatalf("soft denial %+v, want a allowed with 2 remaining, b denied", d)
	}
}

// Under concurrency, requests on two counters where one of them runs out
// never admit more than either limit allows, and every denied request's
// refunds leave exactly the admitted requests counted.
func TestAllOrNothingConcurrent(t *testing.T) {
	srv := memcachetest.Start(t)
	stores := []*memcache.Store{newStore(t, []string{srv.Addr()}, nil), newStore(t, []string{srv.Addr()}, nil)}
	a, b := uniq(t)+".a", uniq(t)+".b"
	la, lb := fixed(1000, time.Hour), fixed(25, time.Hour)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			d, err := algotest.Take(context.Background(), stores[i%2], []algo.Hit{{Key: a, Limit: la, Cost: 1}, {Key: b, Limit: lb, Cost: 1}})
			if err != nil {
				t.Error(err)
				return
			}
			if d[0].Allowed && d[1].Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := allowed.Load(); n != 25 {
		t.Fatalf("allowed %d of 100, want exactly 25 (b's limit)", n)
	}
	d := take(t, stores[0], algo.Hit{Key: a, Limit: la, Cost: 0}, algo.Hit{Key: b, Limit: lb, Cost: 0})
	if d[0].Remaining != 1000-25 {
		t.Fatalf("a has %d remaining after the burst, want %d: denied requests were not refunded", d[0].Remaining, 1000-25)
	}
}

// Window rollover: a new window is a new counter (pinned clock), and the
// counter expires after its window (memcached's own expiry, read back with
// the meta debug command): on the real clock, at the window's end plus
// the grace; on a pinned clock an hour later, since memcached expires by
// real time, which a pinned clock does not follow (a test may spend more
// real time at one pinned instant than the window has left).
func TestWindowRolloverAndExpiry(t *testing.T) {
	srv := memcachetest.Start(t)
	clk := newPinned(time.Date(2026, 3, 14, 15, 9, 10, 0, time.UTC))
	s := newStore(t, []string{srv.Addr()}, clk.Now)
	k, l := uniq(t), fixed(2, time.Minute)
	take(t, s, algo.Hit{Key: k, Limit: l, Cost: 2})
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1}); d[0].Allowed || d[0].ResetAfter != 50*time.Second {
		t.Fatalf("third hit %+v, want denied with 50s until reset", d[0])
	}
	start := clk.Now().Truncate(time.Minute).UnixMicro()
	ck := memcache.CounterKey(k, start)
	// 50 s left in the window, the 2 s grace and an hour; memcached
	// rounds to its one-second clock, and seconds may pass between the
	// take and the read.
	if exp := metaExp(t, srv, ck); exp < 3600+35 || exp > 3600+53 {
		t.Fatalf("counter %s on a pinned clock: expires in %d s, want [3635, 3653] s", ck, exp)
	}
	clk.Advance(50 * time.Second)
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1}); !d[0].Allowed || d[0].Remaining != 1 || d[0].ResetAfter != time.Minute {
		t.Fatalf("first hit of the next window %+v, want allowed with 1 remaining, 60s reset", d[0])
	}

	// The real clock: the window's rest plus the grace, not the whole
	// window (62 s). A take that straddles a window's end is taken again.
	wall := newStore(t, []string{srv.Addr()}, nil)
	for i := 0; ; i++ {
		if i == 3 {
			t.Fatal("three takes straddled a window's end")
		}
		before := time.Now()
		rk := k + "r" + strconv.Itoa(i)
		take(t, wall, algo.Hit{Key: rk, Limit: l, Cost: 1})
		after := time.Now()
		ws, we := algo.WindowBoundsUs(l, before.UnixMicro())
		if as, _ := algo.WindowBoundsUs(l, after.UnixMicro()); as != ws {
			continue
		}
		left := int((we - before.UnixMicro() + 999_999) / 1e6)
		ck := memcache.CounterKey(rk, ws)
		if exp := metaExp(t, srv, ck); exp < left-int(time.Since(before)/time.Second)-2 || exp > left+3 {
			t.Fatalf("counter %s on the real clock: expires in %d s, want about %d s (the window's rest and the grace)", ck, exp, left+2)
		}
		break
	}
	// A month-long window expires by an absolute time (beyond memcached's
	// 30-day bound on relative times): still about the window's length.
	ml := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: 40 * 24 * time.Hour}
	before := time.Now()
	take(t, wall, algo.Hit{Key: k + "m", Limit: ml, Cost: 1})
	ms, me := algo.WindowBoundsUs(ml, before.UnixMicro())
	left := int((me - before.UnixMicro()) / 1e6)
	if exp := metaExp(t, srv, memcache.CounterKey(k+"m", ms)); exp < left-30 || exp > left+5 {
		t.Fatalf("40-day counter expires in %d s, want about %d s", exp, left)
	}
}

// Clear-text keys with spaces, or long ones, are hashed into legal
// memcached keys.
func TestIllegalKeysAreHashed(t *testing.T) {
	srv := memcachetest.Start(t)
	s := newStore(t, []string{srv.Addr()}, nil)
	l := fixed(1, time.Hour)
	for _, k := range []string{uniq(t) + " with space", uniq(t) + strings.Repeat("x", 300), uniq(t) + "\x01ctl"} {
		if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1}); !d[0].Allowed {
			t.Fatalf("first hit on %.40q denied", k)
		}
		if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1}); d[0].Allowed {
			t.Fatalf("second hit on %.40q allowed: the key does not count", k)
		}
	}
	if got := memcache.CounterKey("a b", 5); strings.ContainsAny(got, " \x00") || !strings.HasPrefix(got, "rlmc1_") {
		t.Fatalf("CounterKey(%q) = %q, want a hashed legal key", "a b", got)
	}
	if got := memcache.CounterKey("rl_abc", 60000000); got != "rl_abc_60000000" {
		t.Fatalf("CounterKey = %q, want rl_abc_60000000", got)
	}
}

func causeOf(err error) string {
	var c interface{ Cause() string }
	if errors.As(err, &c) {
		return c.Cause()
	}
	return ""
}

func eventually(t *testing.T, within time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tickUntil runs the health probe of the store on clk (Tick), first moving
// clk on by advance each time, until cond holds; at most 100 probes (a
// slow probe may outlast the Timeout).
func tickUntil(t *testing.T, clk *clock.Manual, advance time.Duration, cond func() bool, what string) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == 100 {
			t.Fatalf("not after %d probes: %s", i, what)
		}
		clk.Advance(advance)
		clk.Tick(t)
	}
}

// A killed memcached: calls fail with cause refused, Healthy turns false;
// after a restart calls succeed and Healthy turns true again by the
// health probe.
func TestKilledAndRestarted(t *testing.T) {
	srv := memcachetest.Start(t)
	s, clk := probedStore(t, srv, testTimeout)
	tickUntil(t, clk, 0, s.Healthy, "healthy at start")
	k, l := uniq(t), fixed(5, time.Hour)
	take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1})

	srv.Kill()
	_, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: k, Limit: l, Cost: 1}})
	if err == nil || causeOf(err) != memcache.CauseRefused {
		t.Fatalf("Take with memcached killed: %v (cause %q), want cause %q", err, causeOf(err), memcache.CauseRefused)
	}
	if !strings.HasPrefix(err.Error(), "memcache: refused: ") || strings.Contains(err.Error(), k) {
		t.Fatalf("error %q: want the memcache: refused: prefix and no key", err)
	}
	tickUntil(t, clk, 0, func() bool { return !s.Healthy() }, "unhealthy after the kill")

	srv.Restart()
	tickUntil(t, clk, 0, s.Healthy, "healthy after the restart")
	// The restarted memcached is empty: counting starts again.
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1}); !d[0].Allowed || d[0].Remaining != 4 {
		t.Fatalf("after restart %+v, want allowed with 4 remaining", d[0])
	}
}

// metaExp is the expiration of key in seconds from now, from memcached's
// meta debug command ("me"); memcached 1.6 prints it as current_time -
// exptime, so a live counter's value is negative there.
func metaExp(t *testing.T, srv *memcachetest.Server, key string) int {
	t.Helper()
	line, err := srv.Do("me " + key)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "exp="); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n == -1 {
				t.Fatalf("me %s: %q: no expiration", key, line)
			}
			if n < 0 {
				n = -n
			}
			return n
		}
	}
	t.Fatalf("me %s: %q: no exp field", key, line)
	return 0
}

// A frozen memcached: a call returns by its budget (the caller's deadline
// less the margin, or Options.Timeout) with cause timeout, and the store
// turns unhealthy after a whole Timeout of silence; an operation that completes after its caller gave up
// is refunded.
func TestFrozenReturnsByBudget(t *testing.T) {
	srv := memcachetest.Start(t)
	// long: the socket timeout outlives the freeze, so its operations
	// complete after the caller gave up; short: its own Timeout is the
	// budget.
	long, longClk := probedStore(t, srv, 5*time.Second)
	short, shortClk := probedStore(t, srv, 300*time.Millisecond)
	idle, idleClk := probedStore(t, srv, 200*time.Millisecond) // no traffic: its probe notices
	healthy := func(what string) {
		t.Helper()
		tickUntil(t, longClk, 0, long.Healthy, "long "+what)
		tickUntil(t, shortClk, 0, short.Healthy, "short "+what)
		tickUntil(t, idleClk, 0, idle.Healthy, "idle "+what)
	}
	healthy("healthy at start")
	k, l := uniq(t), fixed(5, time.Hour)
	take(t, long, algo.Hit{Key: k, Limit: l, Cost: 1})

	// check times one call from before its caller's deadline (0: none) is
	// set, so that a slow start of the call counts within the budget.
	check := func(name string, s *memcache.Store, deadline time.Duration, key string, bound time.Duration) {
		t.Helper()
		t0 := time.Now()
		ctx := context.Background()
		if deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, deadline)
			defer cancel()
		}
		_, err := algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
		took := time.Since(t0)
		if causeOf(err) != memcache.CauseTimeout {
			t.Fatalf("%s: err %v, want cause timeout", name, err)
		}
		// Returned by the budget; the slack is scheduling delay, never
		// a socket timeout beyond it.
		if took < bound-10*time.Millisecond || took > bound+time.Second {
			t.Fatalf("%s: returned after %v, budget %v", name, took, bound)
		}
	}
	srv.Stop()
	t.Cleanup(srv.Cont)
	check("caller deadline", long, 100*time.Millisecond, k, 100*time.Millisecond)
	check("store timeout", short, 0, uniq(t)+".short", 300*time.Millisecond)
	// Silent for a whole Timeout: unhealthy at once (a budget cut short
	// by the caller's deadline leaves it to the probe).
	if short.Healthy() {
		t.Fatal("healthy right after a call timed out after the store's whole Timeout")
	}
	tickUntil(t, idleClk, 0, func() bool { return !idle.Healthy() }, "idle store unhealthy by its probe while frozen")
	srv.Cont()
	healthy("healthy after thaw")
	// The abandoned take's INCR completed once memcached answered, and
	// was refunded: only the first take is counted.
	eventually(t, 10*time.Second, func() bool {
		d, err := algotest.Take(context.Background(), long, []algo.Hit{{Key: k, Limit: l, Cost: 0}})
		return err == nil && d[0].Remaining == 4
	}, "abandoned take refunded (4 remaining)")
}

// SRV: the servers come from the injected resolver, sorted, the target's
// trailing dot removed, and a refresh replaces them.
func TestSRV(t *testing.T) {
	a, b := memcachetest.Start(t), memcachetest.Start(t)
	var current atomic.Pointer[[]*net.SRV]
	set := func(srvs ...*memcachetest.Server) {
		var recs []*net.SRV
		for _, s := range srvs {
			recs = append(recs, &net.SRV{Target: "127.0.0.1.", Port: uint16(s.Port())})
		}
		current.Store(&recs)
	}
	set(a)
	var lookups atomic.Int64
	o := memcache.DefaultOptions()
	o.SRV = "_memcache._tcp.cache.example"
	o.SRVRefresh = 20 * time.Millisecond
	o.Timeout = testTimeout
	o.LookupSRV = func(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
		lookups.Add(1)
		if service != "memcache" || proto != "tcp" || name != "cache.example" {
			return "", nil, fmt.Errorf("unexpected lookup %s %s %s", service, proto, name)
		}
		return "", *current.Load(), nil
	}
	s := openStore(t, o)
	if got := s.Servers(); len(got) != 1 || got[0] != a.Addr() {
		t.Fatalf("servers %v, want [%s]", got, a.Addr())
	}
	k, l := uniq(t), fixed(1, time.Hour)
	take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1})
	set(b)
	eventually(t, 10*time.Second, func() bool { got := s.Servers(); return len(got) == 1 && got[0] == b.Addr() }, "server list refreshed to b")
	// b holds no counter for k yet.
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1}); !d[0].Allowed {
		t.Fatalf("take on the refreshed server denied: still counting on a")
	}
	// A failed lookup keeps the last list.
	o2 := o
	o2.LookupSRV = func(context.Context, string, string, string) (string, []*net.SRV, error) {
		return "", nil, errors.New("lookup failed")
	}
	s2 := openStore(t, o2)
	if _, err := algotest.Take(context.Background(), s2, []algo.Hit{{Key: k, Limit: l, Cost: 1}}); causeOf(err) != memcache.CauseRefused {
		t.Fatalf("Take without any resolved server: %v, want cause refused", err)
	}
	if s2.Healthy() {
		t.Fatal("healthy without any resolved server")
	}
	set(b, a)
	got := memcache.ServersFromSRV(*current.Load())
	want := []string{a.Addr(), b.Addr()}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("ServersFromSRV = %v, want %v (sorted)", got, want)
	}
}

// A server name that does not resolve yet does not stop New: decisions
// fail with cause refused and the store is unhealthy until it resolves.
func TestUnresolvedAddrs(t *testing.T) {
	o := memcache.DefaultOptions()
	o.Addrs = []string{"memcached.invalid:11211"}
	o.Timeout = testTimeout
	o.HealthInterval = 20 * time.Millisecond
	s := openStore(t, o)
	_, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: uniq(t), Limit: fixed(1, time.Hour), Cost: 1}})
	if causeOf(err) != memcache.CauseRefused {
		t.Fatalf("Take: %v, want cause refused", err)
	}
	if s.Healthy() {
		t.Fatal("healthy without a resolved server")
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*memcache.Options)
		want string
	}{
		{"no server", func(o *memcache.Options) {}, "no server"},
		{"both", func(o *memcache.Options) { o.Addrs = []string{"x:1"}; o.SRV = "_a._tcp.b" }, "both"},
		{"bad srv", func(o *memcache.Options) { o.SRV = "cache.example" }, "_service._proto.name"},
		{"timeout", func(o *memcache.Options) { o.Addrs = []string{"x:1"}; o.Timeout = 0 }, "timeout"},
		{"idle", func(o *memcache.Options) { o.Addrs = []string{"x:1"}; o.MaxIdleConns = 0 }, "idle"},
		{"addr without port", func(o *memcache.Options) { o.Addrs = []string{"cache"} }, "want host:port"},
	} {
		o := memcache.DefaultOptions()
		c.mod(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
