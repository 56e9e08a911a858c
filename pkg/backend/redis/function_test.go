package redis_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// fcallStore is a warmed window-key Store on srv (o.URL set by the
// caller when it is not srv's default user).
func fcallStore(t *testing.T, o redis.Options) *redis.Store {
	t.Helper()
	o.Timeout = 5 * time.Second // exact counts, not latency
	o.MaxWait = 10 * time.Second
	o.WindowKeys = true
	s := openStore(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	return s
}

// hasLibrary reports whether the node of c has the Store's library.
func hasLibrary(t *testing.T, c *goredis.Client) bool {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), goredis.FunctionListQuery{LibraryNamePattern: redis.Window1Lib}).Result()
	if err != nil {
		t.Fatalf("FUNCTION LIST: %v", err)
	}
	return len(libs) == 1
}

// fcBurst runs n concurrent Takes of one hit on key (a fixed window of
// rate per hour), calling mid once half of them were decided, and
// returns how many were allowed; every Take must succeed.
func fcBurst(t *testing.T, s *redis.Store, key string, rate int64, n int, mid func()) int {
	t.Helper()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: rate, Period: time.Hour}
	ctx := context.Background()
	var allowed, done atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < n; i += 16 {
				if i == n/2 {
					once.Do(func() { mid(); close(gate) })
				}
				if i > n/2 {
					<-gate
				}
				d, err := algotest.Take(ctx, s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
				if err != nil {
					t.Errorf("take %d: %v", i, err)
					continue
				}
				if d[0].Allowed {
					allowed.Add(1)
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return int(allowed.Load())
}

// fcSeq runs n Takes of one hit on key (a fixed window of rate per
// hour) one after another, each a lone decision, and returns how many
// were allowed; every Take must succeed.
func fcSeq(t *testing.T, s *redis.Store, key string, rate int64, n int) int {
	t.Helper()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: rate, Period: time.Hour}
	allowed := 0
	for i := range n {
		d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
		if err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
		if d[0].Allowed {
			allowed++
		}
	}
	return allowed
}

// TestFcallLoaded: Warm loads the function library, and sequential lone
// window decisions then go out as FCALL, not EVALSHA, and count exactly.
func TestFcallLoaded(t *testing.T) {
	srv, o := standaloneOptions(t)
	s := fcallStore(t, o)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	if !hasLibrary(t, c) {
		t.Fatalf("library %s not loaded by Warm", redis.Window1Lib)
	}
	// The first decisions learn the server's clock (window.lua reads
	// TIME); the window keys take it from the offset afterwards.
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 150, Period: time.Hour}
	for range 5 {
		if _, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "fc:clock", Limit: l, Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// One caller at a time: concurrent takes share window.lua flushes.
	const n = 200
	if allowed := fcSeq(t, s, "fc:seq", 150, n); allowed != 150 {
		t.Errorf("%d of %d allowed on a 150-per-hour key, want 150", allowed, n)
	}
	stats := commandCalls(t, c)
	if stats["fcall"] != n || stats["eval"] != 0 || stats["evalsha"] != 0 {
		t.Errorf("commandstats %v: want %d FCALLs (one per lone decision) and no EVAL or EVALSHA", stats, n)
	}
}

// TestFcallFunctionFlush: FUNCTION FLUSH in the middle of a burst loses
// and duplicates no decision (exactly rate of n allowed, none failed):
// the calls answered "Function not found" are decided by window1.lua
// instead; the next warm-up loads the library again and FCALL resumes.
func TestFcallFunctionFlush(t *testing.T) {
	srv, o := standaloneOptions(t)
	s := fcallStore(t, o)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	for round := range 3 {
		key := fmt.Sprintf("fc:flush:%d", round)
		got := fcBurst(t, s, key, 300, 500, func() {
			if err := c.FunctionFlush(ctx).Err(); err != nil {
				t.Error(err)
			}
		})
		if got != 300 {
			t.Errorf("round %d: %d of 500 allowed on a 300-per-hour key across FUNCTION FLUSH, want 300", round, got)
		}
		if err := s.Warm(ctx); err != nil {
			t.Fatal(err)
		}
		if !hasLibrary(t, c) {
			t.Fatalf("round %d: library not loaded again by Warm", round)
		}
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got := fcSeq(t, s, "fc:after", 50, 60); got != 50 {
		t.Errorf("after reload: %d of 60 allowed, want 50", got)
	}
	if stats := commandCalls(t, c); stats["fcall"] != 60 || stats["evalsha"] != 0 {
		t.Errorf("commandstats %v after reload: want 60 FCALLs (lone decisions) and no EVALSHA", stats)
	}
}

// TestFcallHealthReload: after FUNCTION FLUSH, the health probe (not a
// request) loads the library again once a call found it missing.
func TestFcallHealthReload(t *testing.T) {
	srv, o := standaloneOptions(t)
	o.HealthInterval = 20 * time.Millisecond
	s := fcallStore(t, o)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got := fcBurst(t, s, "fc:hr", 20, 40, func() {}); got != 20 {
		t.Errorf("%d of 40 allowed, want 20", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !hasLibrary(t, c) {
		if time.Now().After(deadline) {
			t.Fatal("library not loaded again by the health probe")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFcallRestart: a Redis restarted without persistence (no script,
// no function) decides exactly at once: the first calls fall back to
// window1.lua, and the Store loads the library again.
func TestFcallRestart(t *testing.T) {
	srv, o := standaloneOptions(t)
	o.HealthInterval = 20 * time.Millisecond
	s := fcallStore(t, o)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	if got := fcBurst(t, s, "fc:r0", 10, 20, func() {}); got != 10 {
		t.Fatalf("before restart: %d of 20 allowed, want 10", got)
	}
	srv.Restart()
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	// The pool's connections died with the server: retry until a
	// decision succeeds, then count exactly.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "fc:probe", Limit: l, Cost: 1}}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no decision after restart")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := fcBurst(t, s, "fc:r1", 100, 160, func() {}); got != 100 {
		t.Errorf("after restart: %d of 160 allowed, want 100", got)
	}
	for !hasLibrary(t, c) {
		if time.Now().After(deadline) {
			t.Fatal("library not loaded again after restart")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setACLUser makes (or changes) the user lim, password pw, allowed every
// command and key but for rules (ACL SETUSER syntax, space-separated).
func setACLUser(t *testing.T, c *goredis.Client, rules string) {
	t.Helper()
	args := []any{"acl", "setuser", "lim", "on", ">pw", "~*", "&*", "+@all"}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestFcallACL: a user that may not load functions, and one that may
// load but not call them, still decide exactly (window1.lua by
// EVALSHA), and no FCALL is sent once refused.
func TestFcallACL(t *testing.T) {
	for _, tc := range []struct{ name, rules string }{
		{"no function", "-function -fcall -fcall_ro"},
		{"no fcall", "-fcall -fcall_ro"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, o := standaloneOptions(t)
			c := srv.Client()
			t.Cleanup(func() { _ = c.Close() })
			setACLUser(t, c, tc.rules)
			o.URL = fmt.Sprintf("redis://lim:pw@%s", srv.Addr())
			s := fcallStore(t, o)
			for round := range 2 {
				key := fmt.Sprintf("fc:acl:%d", round)
				if got := fcBurst(t, s, key, 40, 100, func() {}); got != 40 {
					t.Errorf("round %d: %d of 100 allowed, want 40", round, got)
				}
			}
			stats := commandCalls(t, c)
			if stats["fcall"] != 0 || stats["evalsha"] == 0 {
				t.Errorf("commandstats %v: want EVALSHA and no FCALL run", stats)
			}
		})
	}
}

// TestFcallOOM: with the library loaded, under OOM a lone hit over the
// limit is still denied (window1.lua reads the count with GET), and one
// that would be allowed fails with cause OOM; nothing is written.
func TestFcallOOM(t *testing.T) {
	srv, o := standaloneOptions(t)
	s := fcallStore(t, o)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	if !hasLibrary(t, c) {
		t.Fatal("library not loaded")
	}
	ctx := context.Background()
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Hour}
	if got := fcBurst(t, s, "fc:oom", 5, 5, func() {}); got != 5 {
		t.Fatalf("%d of 5 allowed, want 5", got)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.StartOOM(t, srv)
	over, errOver := algotest.Take(ctx, s, []algo.Hit{{Key: "fc:oom", Limit: l, Cost: 1}})
	_, errNew := algotest.Take(ctx, s, []algo.Hit{{Key: "fc:oom-new", Limit: l, Cost: 1}})
	redistest.EndOOM(t, srv)
	if errOver != nil || over[0].Allowed || over[0].Remaining != 0 {
		t.Errorf("over the limit under OOM: %+v %v, want a denial", over, errOver)
	}
	if redis.CauseOf(errNew) != redis.CauseOOM {
		t.Errorf("an allowed hit under OOM: %v (cause %q), want OOM", errNew, redis.CauseOf(errNew))
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "cmdstat_fcall:") || infoField(t, info, "cmdstat_fcall", "rejected_calls") != 2 {
		t.Errorf("commandstats:\n%s\nwant the 2 hits under OOM sent as FCALL first (refused)", info)
	}
	if n, err := c.Exists(ctx, "fc:oom-new").Result(); err != nil || n != 0 {
		t.Errorf("written under OOM: %d %v", n, err)
	}
}

// TestFcallCluster: Warm loads the library on every Cluster master, and
// lone decisions on keys of every master go out as FCALL and count
// exactly.
func TestFcallCluster(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	o := redis.DefaultOptions()
	o.Mode, o.Addrs = redis.Cluster, g.Addrs()
	s := fcallStore(t, o)
	masters := 0
	for _, n := range g.Nodes {
		c := n.Client()
		role, err := c.Do(context.Background(), "role").Slice()
		if err != nil {
			t.Fatal(err)
		}
		if role[0] == "master" {
			masters++
			if !hasLibrary(t, c) {
				t.Errorf("master %s has no library", n.Addr())
			}
			_ = c.ConfigResetStat(context.Background()).Err()
		}
		_ = c.Close()
	}
	if masters != 3 {
		t.Fatalf("%d masters, want 3", masters)
	}
	for i := range 12 {
		key := fmt.Sprintf("fc:cl:%d", i)
		if got := fcBurst(t, s, key, 15, 25, func() {}); got != 15 {
			t.Errorf("%s: %d of 25 allowed, want 15", key, got)
		}
	}
	// Concurrent takes share flushes (window.lua); sequential ones are
	// lone decisions, FCALLs on whichever master serves the key.
	for _, n := range g.Nodes {
		c := n.Client()
		_ = c.ConfigResetStat(context.Background()).Err()
		_ = c.Close()
	}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Hour}
	for i := range 60 {
		if _, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: fmt.Sprintf("fc:seq:%d", i%30), Limit: l, Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range g.Nodes {
		c := n.Client()
		if stats := commandCalls(t, c); stats["incrby"] > 0 && (stats["fcall"] == 0 || stats["eval"] != 0) {
			t.Errorf("master %s: commandstats %v, want FCALL for sequential lone decisions", n.Addr(), stats)
		}
		_ = c.Close()
	}
}

// logLines is a redis.Logger that keeps the lines it is given.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
	l.mu.Unlock()
}

// count is how many lines contain every one of subs.
func (l *logLines) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// tickFunctions runs one health probe iteration of s on clk and waits
// until the function load it started, if any, has ended.
func tickFunctions(t *testing.T, s *redis.Store, clk *clock.Manual) {
	t.Helper()
	clk.Tick(t)
	end := time.Now().Add(stateWithin)
	for redis.FunctionsReloading(s) {
		if time.Now().After(end) {
			t.Fatalf("function load still running after %v", stateWithin)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noperms is the server's errorstat_NOPERM count (refusals by an ACL).
func noperms(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	return infoField(t, info, "errorstat_NOPERM", "count")
}

// TestFcallACLGranted: a master that refused functions (an ACL) stays on
// EVALSHA while they stay refused, is tried again by the health probe
// every FnRetry on the Store's clock, and goes back to FCALL once they
// are granted, FnRetry after the previous try and not before; each
// change of state is logged once, the tries that are refused again not
// at all.
func TestFcallACLGranted(t *testing.T) {
	const interval = 10 * time.Second // the health probe's, on the manual clock
	for _, tc := range []struct{ name, rules string }{
		{"no function", "-function -fcall -fcall_ro"},
		{"no fcall", "-fcall -fcall_ro"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, o := standaloneOptions(t)
			c := srv.Client()
			t.Cleanup(func() { _ = c.Close() })
			ctx := context.Background()
			setUser := func(rules string) { t.Helper(); setACLUser(t, c, rules) }
			setUser(tc.rules)
			logs := &logLines{}
			t.Cleanup(redis.CaptureLog(logs))

			o.URL = fmt.Sprintf("redis://lim:pw@%s", srv.Addr())
			o.Timeout, o.MaxWait = 5*time.Second, 10*time.Second
			o.WindowKeys = true
			o.HealthInterval = interval
			clk := clock.NewManual()
			s, err := redis.NewOnClock(o, clk)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if err := s.Warm(wctx); err != nil {
				t.Fatalf("Warm: %v", err)
			}
			// The first lone decision is refused as FCALL ("no fcall") and
			// learns the server's clock.
			if got := fcSeq(t, s, "fc:grant:clock", 5, 5); got != 5 {
				t.Fatalf("%d of 5 allowed, want 5", got)
			}
			if redis.FcallOn(s) {
				t.Fatal("FCALL on while the ACL refuses functions")
			}
			// Refused again: the health probe tries once due, and the
			// master stays on EVALSHA without a new log line.
			refused := noperms(t, c)
			for i := 0; noperms(t, c) == refused; i++ {
				if time.Duration(i)*interval > redis.FnRetry+interval {
					t.Fatalf("no try of functions within %d probe iterations of %v", i, interval)
				}
				tickFunctions(t, s, clk)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if got := fcSeq(t, s, "fc:grant:refused", 20, 30); got != 20 {
				t.Errorf("still refused: %d of 30 allowed, want 20", got)
			}
			if stats := commandCalls(t, c); stats["fcall"] != 0 || stats["evalsha"] != 30 {
				t.Errorf("still refused: commandstats %v, want 30 EVALSHA and no FCALL", stats)
			}

			// Granted: not used before FnRetry after the last try (the
			// ticks before it are not due), used after.
			setUser("+function +fcall +fcall_ro")
			ticks := 0
			for ; time.Duration(ticks+1)*interval < redis.FnRetry; ticks++ {
				tickFunctions(t, s, clk)
				if redis.FcallOn(s) {
					t.Fatalf("FCALL on %v after the last try, before FnRetry (%v)", time.Duration(ticks+1)*interval, redis.FnRetry)
				}
			}
			tickFunctions(t, s, clk)
			if !redis.FcallOn(s) {
				t.Fatalf("functions granted: still on EVALSHA %v after the last try (FnRetry %v)", time.Duration(ticks+1)*interval, redis.FnRetry)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			const n = 60
			if got := fcSeq(t, s, "fc:grant:after", 40, n); got != 40 {
				t.Errorf("granted: %d of %d allowed, want 40", got, n)
			}
			if stats := commandCalls(t, c); stats["fcall"] != n || stats["evalsha"] != 0 || stats["eval"] != 0 {
				t.Errorf("granted: commandstats %v, want %d FCALLs (one per lone decision) and no EVAL or EVALSHA", stats, n)
			}
			if got := logs.count("functions unavailable", srv.Addr()); got != 1 {
				t.Errorf("%d lines of functions unavailable naming %s, want 1: %q", got, srv.Addr(), logs.lines)
			}
			if got := logs.count("functions available again", srv.Addr()); got != 1 {
				t.Errorf("%d lines of functions available again naming %s, want 1: %q", got, srv.Addr(), logs.lines)
			}
		})
	}
}

// TestFcallNameShort: the function FCALL names is at most 16 bytes (Redis
// hashes it twice per call, in 8-byte blocks), is the one function of
// the library Warm loads, and that library's name is not the function's,
// so a build whose function is named otherwise loads a library of its
// own instead of replacing this one.
func TestFcallNameShort(t *testing.T) {
	if n := len(redis.Window1Function); n > 16 {
		t.Errorf("function name %q is %d bytes, want at most 16", redis.Window1Function, n)
	}
	srv, o := standaloneOptions(t)
	s := fcallStore(t, o)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	libs, err := c.FunctionList(context.Background(), goredis.FunctionListQuery{}).Result()
	if err != nil {
		t.Fatalf("FUNCTION LIST: %v", err)
	}
	if len(libs) != 1 || len(libs[0].Functions) != 1 {
		t.Fatalf("FUNCTION LIST after Warm: %+v, want one library of one function", libs)
	}
	lib, fn := libs[0].Name, libs[0].Functions[0].Name
	if fn != redis.Window1Function || lib != redis.Window1Lib || lib == fn || !strings.HasPrefix(lib, "ratelimitd_") {
		t.Fatalf("library %q function %q, want library %q (ratelimitd_…, not the function's name) of function %q",
			lib, fn, redis.Window1Lib, redis.Window1Function)
	}
	// A decision through it (the name FCALL sends) counts.
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 6, Period: time.Hour}
	for i := range 10 {
		d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "fcall-name", Limit: l, Cost: 1}})
		if err != nil {
			t.Fatalf("Take %d: %v", i, err)
		}
		if want := i < 6; d[0].Allowed != want {
			t.Fatalf("Take %d: allowed %v, want %v", i, d[0].Allowed, want)
		}
	}
	st, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	if !strings.Contains(st, "cmdstat_fcall:") {
		t.Fatalf("no FCALL sent:\n%s", st)
	}
}
