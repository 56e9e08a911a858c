package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestPinnedClockEveryKeyOutlastsRealTime is TestPinnedClockKeyOutlastsRealTime
// for every other layout a pinned Store writes: window keys (window1.lua
// by EVALSHA and as a Function, window.lua), lean keys (lean.lua: sliding
// window and token bucket, lone and in a request of two), native
// counting and leases. The clock is pinned to the last microsecond of a
// window of 5 s, months away from the wall clock: every key written must
// keep at least an hour of real time, since Redis expires keys by real
// time and a starved host may spend more than the window's rest between
// two steps at the same pinned instant.
func TestPinnedClockEveryKeyOutlastsRealTime(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	const p = 5 * time.Second
	end := time.UnixMicro((epoch0.UnixMicro()/p.Microseconds() + 1) * p.Microseconds())
	clk := newPinnedClock(end.Add(-time.Microsecond))
	fixed := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: p}
	sliding := algo.Limit{Kind: algo.SlidingWindow, Rate: 3, Period: p}
	bucket := algo.Limit{Kind: algo.TokenBucket, Rate: 3, Period: p}

	ws := windowStore(t, srv, clk.Now)
	fn := windowStore(t, srv, clk.Now) // window1.lua as a Function once warm
	if err := fn.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	no := redis.DefaultOptions()
	no.URL = srv.URL()
	no.Timeout = 5 * time.Second
	no.MaxWait = 10 * time.Second
	no.Now = clk.Now
	no.NativeCounting = true
	native := openStore(t, no)

	// A lease Store born (Options.Now at New) in the window before: a
	// window that began before born counts as full and grants nothing.
	lclk := newPinnedClock(end.Add(-2 * p))
	leases := windowStore(t, srv, lclk.Now)
	lclk.Set(clk.Now())

	take := func(s *redis.Store, hits ...algo.Hit) func() error {
		return func() error { _, err := algotest.Take(ctx, s, hits); return err }
	}
	lease := func(key string, l algo.Limit) func() error {
		return func() error {
			g, err := leases.Lease(ctx, algo.LeaseRequest{Key: key, Limit: l, Subscriber: 1, Demand: 1, Want: 1, Stale: 1})
			if err == nil && g.Granted != 1 {
				t.Errorf("%s: lease granted %d of 1", key, g.Granted)
			}
			return err
		}
	}
	cases := []struct {
		prefix string
		keys   int // written at least
		run    func() error
	}{
		{"pin:w1", 1, take(ws, algo.Hit{Key: "pin:w1", Limit: fixed, Cost: 1})},
		{"pin:fn", 1, take(fn, algo.Hit{Key: "pin:fn", Limit: fixed, Cost: 1})},
		{"pin:w2", 2, take(ws, algo.Hit{Key: "pin:w2a", Limit: fixed, Cost: 1}, algo.Hit{Key: "pin:w2b", Limit: fixed, Cost: 2})},
		{"pin:s1", 1, take(ws, algo.Hit{Key: "pin:s1", Limit: sliding, Cost: 1})},
		{"pin:s2", 2, take(ws, algo.Hit{Key: "pin:s2a", Limit: sliding, Cost: 1}, algo.Hit{Key: "pin:s2b", Limit: sliding, Cost: 2})},
		{"pin:g1", 1, take(ws, algo.Hit{Key: "pin:g1", Limit: bucket, Cost: 1})},
		{"pin:g2", 2, take(ws, algo.Hit{Key: "pin:g2a", Limit: bucket, Cost: 1}, algo.Hit{Key: "pin:g2b", Limit: bucket, Cost: 2})},
		{"pin:n", 2, take(native, algo.Hit{Key: "pin:na", Limit: fixed, Cost: 1, Charge: true}, algo.Hit{Key: "pin:nb", Limit: fixed, Cost: 1, Charge: true})},
		{"pin:lf", 2, lease("pin:lf", fixed)},
		{"pin:ls", 2, lease("pin:ls", sliding)},
		{"pin:lg", 2, lease("pin:lg", bucket)},
	}
	fcalls := func() string {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "cmdstat_fcall:") {
				return strings.TrimSpace(line)
			}
		}
		return ""
	}
	for _, tc := range cases {
		before := fcalls()
		written := time.Now() // the keys are written after this
		if err := tc.run(); err != nil {
			t.Fatalf("%s: %v", tc.prefix, err)
		}
		if tc.prefix == "pin:fn" && fcalls() == before {
			t.Fatalf("%s: the lone window take was not an FCALL (%q)", tc.prefix, before)
		}
		var keys []string
		for _, k := range scanKeys(t, c) {
			if strings.Contains(k, tc.prefix) {
				keys = append(keys, k)
			}
		}
		if len(keys) < tc.keys {
			t.Fatalf("%s: keys %q, want at least %d", tc.prefix, keys, tc.keys)
		}
		for _, k := range keys {
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			// an hour from the write, of which some real time has passed
			if want := time.Hour - time.Since(written); ttl < want {
				t.Errorf("%s: PTTL %s = %v with a pinned clock, want at least %v (an hour from the write)", tc.prefix, k, ttl, want)
			}
		}
	}
}

// TestPinnedClockAnswerOutlastsRealTime: at one pinned instant, a window
// key's count still denies after more real time than the window's
// length has passed (window keys and native counting; a 10 ms window):
// the pinned clock alone decides what the algorithm sees.
func TestPinnedClockAnswerOutlastsRealTime(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	clk := newPinnedClock(epoch0)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 5 * time.Second
	o.MaxWait = 10 * time.Second
	o.Now = clk.Now
	o.NativeCounting = true
	stores := map[string]*redis.Store{"window keys": windowStore(t, srv, clk.Now), "native": openStore(t, o)}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: 10 * time.Millisecond}
	for name, s := range stores {
		hit := algo.Hit{Key: "answer:" + name, Limit: l, Cost: 1, Charge: name == "native"}
		for i, want := range []bool{true, false} {
			if i == 1 {
				// more real time than the window and any TTL slack of
				// a clock that is not pinned (a second)
				time.Sleep(1100 * time.Millisecond)
			}
			d, err := algotest.Take(ctx, s, []algo.Hit{hit})
			if err != nil {
				t.Fatal(err)
			}
			if d[0].Allowed != want {
				t.Errorf("%s: take %d at one pinned instant: %+v, want allowed %v", name, i, d[0], want)
			}
		}
	}
}

// TestCertainDenierLeads: with window keys, a request mixing a lean key
// (a take and a release of it) with a rate-0 limit is two script calls;
// the rate-0 group denies for sure and goes first, even when the lean key
// denied lately (a hot key otherwise leads), so the lean group is decided
// as denied and every decision equals pkg/algo's. Taken first and then
// refunded, its take's check would be reported after the release.
func TestCertainDenierLeads(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	clk := newPinnedClock(epoch0)
	s := windowStore(t, srv, clk.Now)
	a := algo.Limit{Kind: algo.SlidingWindow, Rate: 10, Period: 111*time.Second + 25848*time.Microsecond}
	zero := algo.Limit{Kind: algo.SlidingWindow, Rate: 0, Period: 77*time.Second + 45*time.Microsecond}
	steps := [][]algo.Hit{
		{{Key: "lead:a", Limit: a, Cost: 6}},
		// a denies (cost above capacity): the lean key is hot
		{{Key: "lead:a", Limit: a, Cost: 12}, {Key: "lead:b", Limit: zero, Cost: 1, Soft: true}},
		{{Key: "lead:a", Limit: a, Cost: 1}, {Key: "lead:a", Limit: a, Cost: 10, Release: true}, {Key: "lead:b", Limit: zero, Cost: 2, Charge: true}},
		{{Key: "lead:a", Limit: a, Cost: 1}},
	}
	states := map[string]algo.State{}
	now := clk.Now()
	for i, hits := range steps {
		want := algotest.Reference(states, hits, now)
		got, err := algotest.Take(ctx, s, hits)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		for j := range hits {
			if got[j] != want[j] {
				t.Errorf("step %d hit %d %+v:\n redis %+v\n  algo %+v", i, j, hits[j], got[j], want[j])
			}
		}
		now = now.Add(time.Second)
		clk.Set(now)
	}
}
