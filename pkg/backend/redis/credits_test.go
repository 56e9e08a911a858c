package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// cacheStore is a Store with the local over-limit cache on, no health
// probe (its PINGs would count as store commands), warm and subscribed.
func cacheStore(t *testing.T, o Options) *Store {
	t.Helper()
	o.Timeout, o.PoolSize, o.LocalCacheSize, o.HealthInterval = 5*time.Second, 4, 64, 0
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.CreditsLive() {
		t.Fatal("credit subscription not confirmed after Warm")
	}
	return s
}

// waitCacheLive waits (up to 20 s) until s's cache answers: its credit
// subscription is confirmed.
func waitCacheLive(t *testing.T, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.waitCredits(ctx); err != nil {
		t.Fatalf("credit subscription: %v", err)
	}
}

// waitCreditsUntil waits (on the subscription's events, up to 20 s) until
// cond holds.
func waitCreditsUntil(t *testing.T, s *Store, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		ch := s.creditsChanged()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// storeCommands is the number of commands the servers executed, INFO,
// SUBSCRIBE, PUBLISH and a connection's HELLO and CLIENT SETINFO
// excepted (INFO commandstats).
func storeCommands(t *testing.T, infos ...func() (string, error)) int {
	t.Helper()
	n := 0
	for _, info := range infos {
		s, err := info()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(s, "\n") {
			name, _, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
			if !ok || !strings.HasPrefix(strings.TrimSpace(line), "cmdstat_") {
				continue
			}
			switch name {
			case "info", "subscribe", "publish", "ping", "hello", "client|setinfo": // the test's own, and the subscription's
				continue
			}
			n += commandCalls(t, s, name)
		}
	}
	return n
}

func takeOne(t *testing.T, s *Store, h algo.Hit) algo.Decision {
	t.Helper()
	d, err := algotest.Take(context.Background(), s, []algo.Hit{h})
	if err != nil {
		t.Fatal(err)
	}
	return d[0]
}

// TestCacheCreditFromOtherStore: a hot over-limit key costs Redis no
// command after its first denial, and a refund or a reset through another
// Store (replica) reopens it on this one as soon as the credit arrives:
// the next call goes to Redis and is admitted. An override (another limit
// on the same key) is never answered from a denial under the first limit.
// Standalone, TLS 1.3 (the subscription's RESP3 pushes go through the
// dialer's opaque TLS connection) and a 3-master Cluster.
func TestCacheCreditFromOtherStore(t *testing.T) {
	for _, mode := range []string{"standalone", "tls1.3", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			o := DefaultOptions()
			var infos []func() (string, error)
			if mode != "cluster" {
				var opts []redistest.Option
				if mode == "tls1.3" {
					opts = append(opts, redistest.WithTLSProtocols("TLSv1.3"))
				}
				srv := redistest.Standalone(t, opts...)
				o.URL = srv.URL()
				if srv.TLS() != nil {
					o.TLSCAFile = srv.TLS().CAFile
				}
				infos = append(infos, func() (string, error) {
					return srv.Client().Info(context.Background(), "commandstats").Result()
				})
			} else {
				g := redistest.Cluster(t, 3)
				o.Mode, o.URL, o.Addrs = Cluster, "", g.Addrs()
				for _, n := range g.Nodes {
					infos = append(infos, func() (string, error) {
						return n.Client().Info(context.Background(), "commandstats").Result()
					})
				}
			}
			a, b := cacheStore(t, o), cacheStore(t, o)
			l := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Hour}
			h := algo.Hit{Key: "hot", Limit: l, Cost: 1}
			for i := range 3 {
				if d := takeOne(t, a, h); !d.Allowed {
					t.Fatalf("take %d denied: %+v", i+1, d)
				}
			}
			if d := takeOne(t, a, h); d.Allowed || d.FromCache {
				t.Fatalf("fourth take %+v, want denied by Redis", d)
			}
			before := storeCommands(t, infos...)
			for i := range 200 {
				if d := takeOne(t, a, h); d.Allowed || !d.FromCache {
					t.Fatalf("hot take %d: %+v, want a cached denial", i, d)
				}
			}
			if n := storeCommands(t, infos...) - before; n != 0 {
				t.Fatalf("200 cached denials cost %d store commands, want 0", n)
			}
			// An override on the same key is decided by Redis.
			if d := takeOne(t, a, algo.Hit{Key: "hot", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Hour}, Cost: 1}); !d.Allowed {
				t.Fatalf("override to 10/hour %+v, want allowed (4 of 10 used)", d)
			}
			if d := takeOne(t, a, h); d.Allowed || !d.FromCache {
				t.Fatalf("after the override %+v, want the 3/hour denial still cached", d)
			}

			// Another Store refunds 2: the key reopens on a.
			recv := a.credits.received.Load()
			if d := takeOne(t, b, algo.Hit{Key: "hot", Limit: l, Cost: 2, Release: true}); !d.Allowed {
				t.Fatalf("refund %+v", d)
			}
			waitCreditsUntil(t, a, "the refund's credit", func() bool { return a.credits.received.Load() > recv })
			if d := takeOne(t, a, h); !d.Allowed || d.FromCache {
				t.Fatalf("take after another Store's refund %+v, want admitted by Redis", d)
			}
			if d := takeOne(t, a, h); d.Allowed || d.FromCache {
				t.Fatalf("second take after the refund %+v, want denied by Redis (3 of 3 used)", d)
			}
			if d := takeOne(t, a, h); d.Allowed || !d.FromCache {
				t.Fatalf("third take after the refund %+v, want a cached denial", d)
			}

			// Another Store resets the key: it reopens on a.
			recv = a.credits.received.Load()
			if err := b.Reset(context.Background(), []algo.Hit{h}); err != nil {
				t.Fatal(err)
			}
			waitCreditsUntil(t, a, "the reset's credit", func() bool { return a.credits.received.Load() > recv })
			for i := range 3 {
				if d := takeOne(t, a, h); !d.Allowed {
					t.Fatalf("take %d after another Store's reset %+v, want admitted", i+1, d)
				}
			}
		})
	}
}

// TestCacheSubscriptionLost: when the credit subscription is lost the
// cache is flushed and answers nothing until it is confirmed again.
func TestCacheSubscriptionLost(t *testing.T) {
	srv := redistest.Standalone(t)
	o := DefaultOptions()
	o.URL = srv.URL()
	a := cacheStore(t, o)
	h := algo.Hit{Key: "k", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}, Cost: 1}
	takeOne(t, a, h)
	if d := takeOne(t, a, h); d.Allowed {
		t.Fatalf("second take %+v, want denied", d)
	}
	if a.cache.Len() != 1 {
		t.Fatalf("cache holds %d entries, want 1", a.cache.Len())
	}
	lost := a.credits.lost.Load()
	if _, err := srv.Client().Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Result(); err != nil {
		t.Fatal(err)
	}
	waitCreditsUntil(t, a, "the subscription's loss", func() bool { return a.credits.lost.Load() > lost })
	if a.cache.Len() != 0 {
		t.Fatalf("cache holds %d entries after the subscription was lost, want 0", a.cache.Len())
	}
	// A refund applied while nobody listened: the flushed cache asks Redis.
	wks, err := srv.Client().Keys(context.Background(), "{k}:v2:*").Result()
	if err != nil || len(wks) != 1 {
		t.Fatalf("window keys of k: %q %v, want one", wks, err)
	}
	if _, err := srv.Client().Del(context.Background(), wks[0]).Result(); err != nil {
		t.Fatal(err)
	}
	waitCreditsUntil(t, a, "the subscription's return", a.CreditsLive)
	if d := takeOne(t, a, h); !d.Allowed || d.FromCache {
		t.Fatalf("take after the subscription returned %+v, want admitted by Redis", d)
	}
	if d := takeOne(t, a, h); d.Allowed {
		t.Fatalf("%+v, want denied", d)
	}
	if d := takeOne(t, a, h); d.Allowed || !d.FromCache {
		t.Fatalf("%+v, want a cached denial once subscribed again", d)
	}
}

// TestCacheChargesAlwaysCharge: with ratelimitd's own counting
// (Options.CacheUncharged false) an always_charge hit on a hot fixed
// window is never answered from the cache: every denied hit reaches Redis
// and is charged, so a later refund credits a count that includes them
// (the cache changes no decision). With CacheUncharged (reference mode)
// the cache answers them uncharged, as envoyproxy/ratelimit does.
func TestCacheChargesAlwaysCharge(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, uncharged := range []bool{false, true} {
		o := DefaultOptions()
		o.URL, o.CacheUncharged = srv.URL(), uncharged
		s := cacheStore(t, o)
		key := fmt.Sprintf("charged-%v", uncharged)
		h := algo.Hit{Key: key, Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Hour}, Cost: 1, Charge: true}
		fromCache := 0
		for i := range 8 {
			d := takeOne(t, s, h)
			if d.Allowed != (i < 3) {
				t.Fatalf("uncharged=%v take %d: %+v", uncharged, i+1, d)
			}
			if d.FromCache {
				fromCache++
			}
		}
		refund := algo.Hit{Key: key, Limit: h.Limit, Cost: 2, Release: true}
		if _, err := algotest.Take(context.Background(), s, []algo.Hit{refund}); err != nil {
			t.Fatal(err)
		}
		d := takeOne(t, s, h)
		if !uncharged && (fromCache != 0 || d.Allowed) {
			t.Errorf("own counting: %d of 5 denials from the cache, take after a refund of 2 %+v; want 0 and denied (8 charged, 6 after the refund)", fromCache, d)
		}
		if uncharged && (fromCache != 4 || !d.Allowed) {
			t.Errorf("reference counting: %d of 5 denials from the cache, take after a refund of 2 %+v; want 4 and admitted (4 charged, 2 after the refund)", fromCache, d)
		}
	}
}
