package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// nativeStore is a Store with NativeCounting on srv (standalone) or g
// (Cluster), reading the instant from now (nil: time.Now).
func nativeStore(t testing.TB, srv *redistest.Server, g *redistest.ClusterGroup, now func() time.Time, set ...func(*Options)) *Store {
	t.Helper()
	o := DefaultOptions()
	if g != nil {
		o.Mode, o.URL, o.Addrs = Cluster, "", g.Addrs()
	} else {
		o.URL = srv.URL()
	}
	o.Timeout = 2 * time.Second
	o.DialTimeout = 2 * time.Second
	o.PoolSize = 8
	o.Now = now
	o.NativeCounting = true
	// Scheduling delay may hold a call past the default budget: the
	// exactness tests count decisions, not latency.
	o.MaxWait = 20 * time.Second
	for _, f := range set {
		f(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// nativeLimit is the fixed window the native tests charge.
var nativeLimit = algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Hour}

// chargeHit is an always_charge hit of cost on key under l.
func chargeHit(key string, l algo.Limit, cost int64) algo.Hit {
	return algo.Hit{Key: key, Limit: l, Cost: cost, Charge: true}
}

// chargeConcurrently sends perStore one-hit requests (cost 1) from as many
// goroutines to each store, released together, and returns how many were
// allowed.
func chargeConcurrently(t *testing.T, stores []*Store, key string, perStore int) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, len(stores)*perStore)
	for _, s := range stores {
		for range perStore {
			wg.Go(func() {
				<-start
				d, err := algotest.Take(context.Background(), s, []algo.Hit{chargeHit(key, nativeLimit, 1)})
				if err != nil {
					errs <- err
					return
				}
				if d[0].Allowed {
					allowed.Add(1)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return allowed.Load()
}

// TestNativeExactness: always_charge fixed-window hits from many
// goroutines on three Stores admit exactly the limit, every hit is
// counted (the key holds C), the key expires after its window, and no
// script ran (INFO commandstats: INCRBY and PEXPIRE only).
func TestNativeExactness(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	ctl := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer ctl.Close()
	ctx := context.Background()
	clk := func() time.Time { return batchEpoch }
	stores := []*Store{nativeStore(t, srv, nil, clk), nativeStore(t, srv, nil, clk), nativeStore(t, srv, nil, clk)}
	if err := ctl.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const perStore = 100 // C = 300 against L = 100
	if n := chargeConcurrently(t, stores, "native:x", perStore); n != nativeLimit.Rate {
		t.Fatalf("allowed %d of %d, want exactly %d", n, 3*perStore, nativeLimit.Rate)
	}
	info := ctl.Info(ctx, "commandstats").Val()
	ws, we := algo.WindowBoundsUs(nativeLimit, batchEpoch.UnixMicro())
	key := nativeKey("native:x", ws)
	if v, err := ctl.Get(ctx, key).Int64(); err != nil || v != 3*perStore {
		t.Fatalf("GET %s = %d, %v; want %d (every hit charged)", key, v, err, 3*perStore)
	}
	ttl := ctl.PTTL(ctx, key).Val()
	// the window's rest, the skew and, the clock being pinned, the slack
	want := time.Duration(we-batchEpoch.UnixMicro())*time.Microsecond + nativeSkew + pinnedSlackMs*time.Millisecond
	if ttl <= 0 || ttl > want {
		t.Fatalf("PTTL %s = %v, want in (0, %v]", key, ttl, want)
	}
	for _, cmd := range []string{"evalsha", "eval", "get", "set"} {
		if n := commandCalls(t, info, cmd); n != 0 {
			t.Errorf("cmdstat_%s calls = %d, want 0\n%s", cmd, n, info)
		}
	}
	if n := commandCalls(t, info, "incrby"); n != 3*perStore {
		t.Errorf("cmdstat_incrby calls = %d, want %d", n, 3*perStore)
	}
	if n := commandCalls(t, info, "pexpire"); n != 3*perStore {
		t.Errorf("cmdstat_pexpire calls = %d, want %d", n, 3*perStore)
	}
}

// TestNativeClusterExactness is TestNativeExactness on a 3-master
// Cluster, with requests of three keys on different masters: each key
// admits exactly its limit.
func TestNativeClusterExactness(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	clk := func() time.Time { return batchEpoch }
	stores := []*Store{nativeStore(t, g.Nodes[0], g, clk), nativeStore(t, g.Nodes[0], g, clk), nativeStore(t, g.Nodes[0], g, clk)}
	ws, _ := algo.WindowBoundsUs(nativeLimit, batchEpoch.UnixMicro())
	var keys []string
	thirds := map[uint16]bool{}
	for i := 0; len(keys) < 3; i++ {
		k := fmt.Sprintf("native:c%d", i)
		if th := Slot(nativeKey(k, ws)) / 5462; !thirds[th] {
			thirds[th] = true
			keys = append(keys, k)
		}
	}
	var allowed [3]atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	const perStore = 60 // 180 requests against 100 per key
	for _, s := range stores {
		for range perStore {
			wg.Go(func() {
				<-start
				hits := []algo.Hit{chargeHit(keys[0], nativeLimit, 1), chargeHit(keys[1], nativeLimit, 1), chargeHit(keys[2], nativeLimit, 1)}
				d, err := algotest.Take(context.Background(), s, hits)
				if err != nil {
					t.Error(err)
					return
				}
				for i := range d {
					if d[i].Allowed {
						allowed[i].Add(1)
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	c := g.Client()
	defer c.Close()
	for i, k := range keys {
		if n := allowed[i].Load(); n != nativeLimit.Rate {
			t.Errorf("key %s: allowed %d of %d, want %d", k, n, 3*perStore, nativeLimit.Rate)
		}
		if v, err := c.Get(context.Background(), nativeKey(k, ws)).Int64(); err != nil || v != 3*perStore {
			t.Errorf("key %s: count %d, %v; want %d", k, v, err, 3*perStore)
		}
	}
}

// TestNativeEqualsReference: random requests mixing native hits (takes,
// checks, releases, Soft, a key twice, a rate of 0) with script hits (all_or_nothing
// fixed windows and token buckets, always_charge token buckets) decide
// exactly as algotest.Reference, on standalone and Cluster, with and
// without Options.WindowKeys (the all_or_nothing fixed window then goes to
// window.lua).
func TestNativeEqualsReference(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	g := redistest.Cluster(t, 3)
	for _, mode := range []string{"standalone", "cluster", "standalone-window-keys", "cluster-window-keys"} {
		t.Run(mode, func(t *testing.T) {
			var clock atomic.Int64
			clock.Store(algotest.Base.UnixMicro())
			now := func() time.Time { return time.UnixMicro(clock.Load()) }
			var s *Store
			wk := func(o *Options) { o.WindowKeys = strings.HasSuffix(mode, "-window-keys") }
			if strings.HasPrefix(mode, "cluster") {
				s = nativeStore(t, nil, g, now, wk)
			} else {
				s = nativeStore(t, srv, nil, now, wk)
			}
			fw := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: 10 * time.Second}
			fw0 := algo.Limit{Kind: algo.FixedWindow, Period: 10 * time.Second}
			tb := algo.Limit{Kind: algo.TokenBucket, Rate: 3, Period: 10 * time.Second, Burst: 3}
			rng := rand.New(rand.NewPCG(1, 2))
			prefix := "native:ref:" + mode + ":" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
			ref := map[string]algo.State{}
			for step := range 400 {
				clock.Add(int64(rng.IntN(1500)) * 1000)
				n := 1 + rng.IntN(3)
				hits := make([]algo.Hit, n)
				for i := range hits {
					h := algo.Hit{Cost: int64(rng.IntN(4))}
					switch rng.IntN(5) {
					case 0, 1: // native: always_charge fixed windows "a", "b"
						h.Key, h.Limit, h.Charge = prefix+string(rune('a'+rng.IntN(2))), fw, true
						h.Release = rng.IntN(6) == 0
					case 4: // native, decided in Go: a fixed window of rate 0
						h.Key, h.Limit, h.Charge = prefix+"z", fw0, true
						h.Release = rng.IntN(6) == 0
					case 2: // script: all_or_nothing fixed window "c"
						h.Key, h.Limit = prefix+"c", fw
					default: // script: token bucket "t", always_charge or not by key
						h.Key, h.Limit = prefix+"t", tb
						if rng.IntN(2) == 0 {
							h.Key, h.Charge = prefix+"tc", true
						}
					}
					h.Soft = rng.IntN(5) == 0
					hits[i] = h
				}
				at := now()
				want := algotest.Reference(ref, hits, at)
				got, err := algotest.Take(context.Background(), s, hits)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("step %d at %v hit %d (%+v):\n got %+v\nwant %+v", step, at.Sub(algotest.Base), i, hits[i], got[i], want[i])
					}
				}
			}
		})
	}
}

// TestNativeExpireEveryHit: each native hit sends INCRBY and a PEXPIRE
// of two arguments, the key and its TTL (no NX, which would make Redis
// look the key's TTL up first), as the reference sends EXPIRE on every
// hit; the count stays exact across Stores, one PEXPIRE per hit.
func TestNativeExpireEveryHit(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	ctl := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer ctl.Close()
	ctx := context.Background()
	c := newNativeCall([]algo.Hit{chargeHit("native:shape", nativeLimit, 1)}, batchEpoch.UnixMicro(), 0)
	c.queue(ctx, ctl.Pipeline())
	if got, want := fmt.Sprint(c.exp[0].Args()), fmt.Sprint([]any{"pexpire", c.keys[0], c.ttl[0]}); got != want {
		t.Errorf("PEXPIRE args %s, want %s", got, want)
	}
	clk := func() time.Time { return batchEpoch }
	stores := []*Store{nativeStore(t, srv, nil, clk), nativeStore(t, srv, nil, clk)}
	ctl.ConfigResetStat(ctx)
	if n := chargeConcurrently(t, stores, "native:every", 80); n != nativeLimit.Rate {
		t.Fatalf("allowed %d of 160, want %d", n, nativeLimit.Rate)
	}
	ws, _ := algo.WindowBoundsUs(nativeLimit, batchEpoch.UnixMicro())
	key := nativeKey("native:every", ws)
	if ttl := ctl.PTTL(ctx, key).Val(); ttl <= 0 {
		t.Fatalf("PTTL %s = %v, want > 0", key, ttl)
	}
	info := ctl.Info(ctx, "commandstats").Val()
	for _, cmd := range []string{"incrby", "pexpire"} {
		if n := commandCalls(t, info, cmd); n != 160 {
			t.Errorf("cmdstat_%s calls = %d, want 160", cmd, n)
		}
	}
}

// TestNativeExpireFromLastHit: a later hit of the window sets the key's
// TTL from its own instant, so the key lives until the window's end (plus
// nativeSkew and the pinned clock's slack) as the last sender sees it,
// not as the first did.
func TestNativeExpireFromLastHit(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	ctl := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer ctl.Close()
	ctx := context.Background()
	ws, we := algo.WindowBoundsUs(nativeLimit, batchEpoch.UnixMicro())
	var at atomic.Int64
	at.Store(ws + time.Minute.Microseconds())
	s := nativeStore(t, srv, nil, func() time.Time { return time.UnixMicro(at.Load()) })
	take := func() {
		t.Helper()
		d, err := algotest.Take(ctx, s, []algo.Hit{chargeHit("native:last", nativeLimit, 1)})
		if err != nil || !d[0].Allowed {
			t.Fatalf("take: %+v, %v", d, err)
		}
	}
	key := nativeKey("native:last", ws)
	take()
	first := ctl.PTTL(ctx, key).Val()
	at.Store(we - time.Minute.Microseconds())
	take()
	// The second hit's TTL: a minute to the window's end, plus the skew
	// and the slack; real time only lowers PTTL after it.
	bound := time.Minute + nativeSkew + time.Duration(pinnedSlackMs)*time.Millisecond
	if ttl := ctl.PTTL(ctx, key).Val(); ttl <= 0 || ttl > bound {
		t.Fatalf("PTTL after the later hit = %v (after the first: %v), want in (0, %v]", ttl, first, bound)
	}
}
