package lease

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/opterr"
)

// tally counts, per window start (µs), the units the instances admitted,
// attributed by the decision itself: its window ends ResetAfter after the
// instant it was decided, which lies between the call's start and end.
type tally struct {
	p   int64 // period µs
	mu  sync.Mutex
	n   map[int64]int64
	bad atomic.Int64 // decisions whose window is not one the call spanned
}

func (ty *tally) add(tb, ta time.Time, d algo.Decision) {
	est := ta.UnixMicro() + d.ResetAfter.Microseconds()
	we := (est + ty.p/2) / ty.p * ty.p
	ws := we - ty.p
	if b, a := tb.UnixMicro(), ta.UnixMicro(); ws < b-b%ty.p || ws > a-a%ty.p {
		ty.bad.Add(1)
	}
	ty.mu.Lock()
	ty.n[ws]++
	ty.mu.Unlock()
}

func (ty *tally) windows() map[int64]int64 {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	out := make(map[int64]int64, len(ty.n))
	for k, v := range ty.n {
		out[k] = v
	}
	return out
}

// hammer runs workers goroutines per instance asking for one unit each
// in a loop until stop is closed, pausing *pace between asks (0: demand
// far above any limit here), and counts what they admit.
func hammer(ctx context.Context, insts []*Leaser, hit algo.Hit, workers int, ty *tally, stop <-chan struct{}, alive []*atomic.Bool, pace *atomic.Int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i, ls := range insts {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hits := []algo.Hit{hit}
				for {
					select {
					case <-stop:
						return
					default:
					}
					if !alive[i].Load() {
						return
					}
					if d := pace.Load(); d > 0 {
						time.Sleep(time.Duration(d))
					}
					tb := time.Now()
					d, failed, _, _ := ls.Take(ctx, hits)
					ta := time.Now()
					if len(failed) == 0 && d[0].Allowed {
						ty.add(tb, ta, d[0])
					} else if len(failed) > 0 {
						time.Sleep(time.Millisecond) // the store is down: failure_mode's business
					}
				}
			}()
		}
	}
	return &wg
}

// overLimit runs 3 instances on st, 10 workers each, with a fixed window
// of 1000 per 500 ms, through phases: steady demand far above the limit;
// paced demand 3 times the limit; instance 3 killed (its units never
// returned); the store restarted (restart, unless nil) while the
// instances hold units. It checks that no window admits more than the
// limit, that the steady windows admit at least 95 % of it, and that
// every decision's window is one the call spanned.
func overLimit(t *testing.T, st Store, restart func()) {
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: 500 * time.Millisecond}
	p := l.Period.Microseconds()
	ctx := context.Background()
	insts := make([]*Leaser, 3)
	alive := make([]*atomic.Bool, 3)
	for i := range insts {
		ls, err := New(Options{Store: st, Subscriber: int64(i + 1), Interval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		insts[i] = ls
		alive[i] = new(atomic.Bool)
		alive[i].Store(true)
	}
	defer func() {
		for i, ls := range insts {
			if alive[i].Load() {
				_ = ls.Close(ctx)
			}
		}
	}()
	ty := &tally{p: p, n: map[int64]int64{}}
	stop := make(chan struct{})
	// Start at a window boundary plus a little: the phases cover whole
	// windows.
	now := time.Now().UnixMicro()
	time.Sleep(time.Duration(p-now%p+p/10) * time.Microsecond)
	hit := algo.Hit{Key: "hot:" + t.Name(), Limit: l, Cost: 1}
	var pace atomic.Int64
	wg := hammer(ctx, insts, hit, 10, ty, stop, alive, &pace)

	phase := func(name string, windows int) (from, to int64) {
		now := time.Now().UnixMicro()
		from = now - now%p + p // the first whole window
		time.Sleep(time.Duration(int64(windows)*p+p/10) * time.Microsecond)
		now = time.Now().UnixMicro()
		to = now - now%p // windows before this one are over
		t.Logf("%s: windows %d..%d", name, from, to)
		return from, to
	}
	sFrom, sTo := phase("steady", 4)
	// From here on, 30 workers ask at most 200 times a second each, 3
	// times the limit: the windows are not used up in their first
	// milliseconds, so the instances hold units when one is killed and
	// when the store restarts.
	pace.Store(int64(5 * time.Millisecond))
	phase("paced", 1)
	// Kill instance 3 mid-lease: its loop stops, its units are never
	// returned, its workers stop asking.
	alive[2].Store(false)
	close(insts[2].stop)
	<-insts[2].done
	phase("killed", 2)
	// Restart the store 50 ms into a window, while the instances hold
	// units of it.
	if restart != nil {
		now = time.Now().UnixMicro()
		time.Sleep(time.Duration(p-now%p+p/10) * time.Microsecond)
		restart()
		phase("restarted", 3)
	}
	close(stop)
	wg.Wait()

	got := ty.windows()
	keys := make([]int64, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	var line string
	for _, ws := range keys {
		line += fmt.Sprintf(" %d", got[ws])
		if got[ws] > l.Rate {
			t.Errorf("window %d admitted %d > limit %d", ws, got[ws], l.Rate)
		}
	}
	t.Logf("admitted per window:%s", line)
	// Under steady demand above the limit, the windows together admit
	// at least 95 % of it (one window may lose more to a scheduling
	// stall: units held when it ends are not used).
	var sum, n int64
	for ws := sFrom; ws < sTo; ws += p {
		sum += got[ws]
		n++
	}
	if sum < n*l.Rate*95/100 {
		t.Errorf("steady windows admitted %d of %d × %d: below 95%%", sum, n, l.Rate)
	}
	if n := ty.bad.Load(); n > 0 {
		t.Errorf("%d decisions carried a window their call did not span", n)
	}
}

// The memory store is not restarted here: it lives in the process of
// the leases it grants, so it never restarts while they are held.
func TestNeverOverLimitMemory(t *testing.T) {
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	overLimit(t, s, nil)
}

func redisStore(t *testing.T, o redis.Options) *redis.Store {
	o.Timeout = time.Second
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestNeverOverLimitRedis(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	// One Store per instance, as separate processes have.
	sts := []*redis.Store{redisStore(t, o), redisStore(t, o), redisStore(t, o)}
	var n atomic.Int64
	rr := storeFunc(func(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
		return sts[int(n.Add(1))%3].Lease(ctx, req)
	})
	overLimit(t, rr, srv.Restart)
}

func TestNeverOverLimitCluster(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	o := redis.DefaultOptions()
	o.Mode = redis.Cluster
	o.URL = ""
	o.Addrs = g.Addrs()
	st := redisStore(t, o)
	overLimit(t, st, func() {
		// Restart every master: the key's slot lives on one of them.
		for _, s := range g.Nodes {
			s.Restart()
		}
		g.WaitOK()
	})
}

// sentinelStores starts a Sentinel deployment (a master, a replica, 3
// sentinels) and returns it with one Store per instance, as separate
// processes have, and a Store spreading lease operations over them.
func sentinelStores(t *testing.T) (*redistest.SentinelGroup, Store) {
	redistest.Require(t)
	g := redistest.Sentinel(t)
	o := redis.DefaultOptions()
	o.Mode, o.URL, o.Addrs, o.MasterName = redis.Sentinel, "", g.SentinelAddrs(), redistest.MasterName
	sts := []*redis.Store{redisStore(t, o), redisStore(t, o), redisStore(t, o)}
	var n atomic.Int64
	return g, storeFunc(func(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
		return sts[int(n.Add(1))%3].Lease(ctx, req)
	})
}

// TestNeverOverLimitSentinel: leases through Sentinel, the master
// restarted (empty, before the sentinels call it down) while the
// instances hold units.
func TestNeverOverLimitSentinel(t *testing.T) {
	g, st := sentinelStores(t)
	overLimit(t, st, func() { g.Master().Restart() })
}

// TestNeverOverLimitSentinelFailover: leases through Sentinel, the master
// killed while the instances hold units and its replica promoted. A
// failover loses the charges the replica had not received, but only of
// the window the master died in: the sentinels promote the replica no
// sooner than DownAfter, longer than the window, so that window is over
// before the new master grants anything, and no window admits more than
// the limit.
func TestNeverOverLimitSentinelFailover(t *testing.T) {
	// overLimit's window is 500 ms and the master dies 50 ms into one.
	if redistest.DownAfter < 450*time.Millisecond {
		t.Fatalf("DownAfter %v: the new master may grant in the old master's last window", redistest.DownAfter)
	}
	g, st := sentinelStores(t)
	overLimit(t, st, func() {
		old := g.KillMaster()
		start := time.Now()
		nm := g.WaitFailover(old, 30*time.Second)
		t.Logf("failover to %s after %v", nm.Addr(), time.Since(start))
	})
}

type storeFunc func(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error)

func (f storeFunc) Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	return f(ctx, req)
}

// New refuses invalid options with a FieldError naming the field; zero
// values mean the defaults.
func TestOptionsValidate(t *testing.T) {
	st := storeFunc(func(context.Context, algo.LeaseRequest) (algo.LeaseGrant, error) { return algo.LeaseGrant{}, nil })
	for _, c := range []struct {
		opt   Options
		field string
	}{
		{Options{}, "Store"},
		{Options{Store: st, Interval: -time.Second}, "Interval"},
		{Options{Store: st, Interval: MinInterval / 10}, "Interval"},
		{Options{Store: st, Timeout: -time.Second}, "Timeout"},
	} {
		ls, err := New(c.opt)
		if err == nil {
			_ = ls.Close(context.Background())
			t.Errorf("%+v: no error", c.opt)
			continue
		}
		var fe *opterr.FieldError
		if !errors.As(err, &fe) || fe.Package != "lease" || fe.Field != c.field {
			t.Errorf("%+v: error %v, want a FieldError on %s", c.opt, err, c.field)
		}
	}
	for _, iv := range []time.Duration{0, MinInterval, time.Hour} {
		ls, err := New(Options{Store: st, Interval: iv})
		if err != nil {
			t.Fatalf("interval %v: %v", iv, err)
		}
		_ = ls.Close(context.Background())
	}
}
