package memory_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

var _ service.Store = (*memory.Store)(nil)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t testing.TB, opts memory.Options) *memory.Store {
	t.Helper()
	s, err := memory.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	for _, shards := range []int{1, 64} {
		t.Run(fmt.Sprint("shards=", shards), func(t *testing.T) {
			algotest.Run(t, func(t *testing.T, now func() time.Time) algotest.Store {
				return newStore(t, memory.Options{Shards: shards, Now: now})
			})
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []memory.Options{{Shards: -1}, {MaxKeys: -1}, {Shards: 1 << 20}} {
		if _, err := memory.New(o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// TestConcurrentExactlyN: 50 goroutines on a 10/minute key, exactly 10 pass.
func TestConcurrentExactlyN(t *testing.T) {
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket, algo.Concurrency} {
		s := newStore(t, memory.Options{Shards: 4})
		l := algo.Limit{Kind: k, Rate: 10, Period: time.Minute}
		var ok atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "k", Limit: l, Cost: 1}, {Key: "other", Limit: l, Cost: 0}})
				if err != nil {
					t.Error(err)
					return
				}
				if d[0].Allowed {
					ok.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		if got := ok.Load(); got != 10 {
			t.Errorf("%v: %d allowed, want 10", k, got)
		}
	}
}

type clock struct{ us atomic.Int64 }

func (c *clock) now() time.Time           { return time.UnixMicro(c.us.Load()) }
func (c *clock) add(d time.Duration)      { c.us.Add(d.Microseconds()) }
func newClock(t time.Time) *clock         { c := &clock{}; c.us.Store(t.UnixMicro()); return c }
func hit(k string, l algo.Limit) algo.Hit { return algo.Hit{Key: k, Limit: l, Cost: 1} }

// TestIdleKeysExpire: unique keys do not accumulate.
func TestIdleKeysExpire(t *testing.T) {
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Now: c.now, SweepInterval: -1})
	limits := []algo.Limit{
		{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute},
		{Kind: algo.SlidingWindow, Rate: 5, Period: time.Minute},
		{Kind: algo.SlidingLog, Rate: 5, Period: time.Minute},
		{Kind: algo.TokenBucket, Rate: 5, Period: time.Minute},
		{Kind: algo.Concurrency, Rate: 5, Period: time.Minute},
	}
	for i := range 1000 {
		l := limits[i%len(limits)]
		if _, err := algotest.Take(context.Background(), s, []algo.Hit{hit(fmt.Sprint("u", i), l)}); err != nil {
			t.Fatal(err)
		}
	}
	if s.Len() != 1000 {
		t.Fatalf("Len %d, want 1000", s.Len())
	}
	c.add(time.Minute)
	s.Sweep()
	// the sliding window keeps its count for one more window; nothing else survives
	if s.Len() != 200 {
		t.Fatalf("after one minute Len %d, want 200 (sliding window keys)", s.Len())
	}
	c.add(time.Minute)
	s.Sweep()
	if s.Len() != 0 {
		t.Fatalf("after two minutes Len %d, want 0", s.Len())
	}
	// a check on an absent key stores nothing
	if _, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "x", Limit: limits[0]}}); err != nil || s.Len() != 0 {
		t.Fatalf("check created a key: %v %d", err, s.Len())
	}
}

// TestLazyExpiry: an expired entry is not read back even before a sweep.
func TestLazyExpiry(t *testing.T) {
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Now: c.now, SweepInterval: -1})
	l := algo.Limit{Kind: algo.SlidingLog, Rate: 1, Period: time.Second}
	// an old log entry that the clock going back would otherwise revive is gone
	if d, _ := algotest.Take(context.Background(), s, []algo.Hit{hit("k", l)}); !d[0].Allowed {
		t.Fatal("first denied")
	}
	c.add(time.Second)
	if d, _ := algotest.Take(context.Background(), s, []algo.Hit{hit("k", l)}); !d[0].Allowed || d[0].Remaining != 0 {
		t.Fatalf("after expiry: %+v", d[0])
	}
	if s.Len() != 1 {
		t.Fatalf("Len %d", s.Len())
	}
}

// TestMaxKeys: a full store decides a request with a new key, the stored
// key exactly and the new one with its sketch, which counts it on; once
// keys expire the new key gets a slot.
func TestMaxKeys(t *testing.T) {
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Now: c.now, MaxKeys: 2, SweepInterval: -1})
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}
	for _, k := range []string{"a", "b"} {
		if _, err := algotest.Take(context.Background(), s, []algo.Hit{hit(k, l)}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := algotest.Take(context.Background(), s, []algo.Hit{hit("a", l), hit("c", l)})
	if err != nil || !d[0].Allowed || d[0].Remaining != 3 || !d[1].Allowed || d[1].Remaining != 4 {
		t.Fatalf("a and new c at a full store: %+v %v; want both allowed, 3 and 4 left", d, err)
	}
	if s.Len() != 2 {
		t.Fatalf("Len %d, want 2", s.Len())
	}
	if sk, ref := s.Approximated(); sk != 1 || ref != 0 {
		t.Fatalf("Approximated %d, %d; want 1, 0", sk, ref)
	}
	for want := int64(3); want >= -1; want-- {
		d, err := algotest.Take(context.Background(), s, []algo.Hit{hit("c", l)})
		if err != nil || d[0].Allowed != (want >= 0) || d[0].Remaining != max(want, 0) {
			t.Fatalf("c in the sketch: %+v %v; want remaining %d", d, err, want)
		}
	}
	c.add(time.Minute)
	d, err = algotest.Take(context.Background(), s, []algo.Hit{hit("c", l)})
	if sk, _ := s.Approximated(); err != nil || d[0].Remaining != 4 || sk != 5 {
		t.Fatalf("c in a new window after keys expired: %+v %v, %d sketched; want 4 left, stored (5 sketched before: the denied hit needed no slot)", d, err, sk)
	}
}

func TestContextCanceled(t *testing.T) {
	s := newStore(t, memory.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := algotest.Take(ctx, s, []algo.Hit{hit("k", algo.Limit{Rate: 1, Period: time.Second})}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

// TestBackgroundSweep: the background sweep drops an expired key within
// one SweepInterval. It runs in a synctest bubble, whose fake clock drives
// the sweep's ticker.
func TestBackgroundSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClock(algotest.Base)
		s := newStore(t, memory.Options{Now: c.now, SweepInterval: time.Millisecond})
		l := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Second}
		algotest.Take(context.Background(), s, []algo.Hit{hit("k", l)})
		c.add(time.Second)
		time.Sleep(time.Millisecond) // one SweepInterval on the bubble's clock
		synctest.Wait()
		if s.Len() != 0 {
			t.Fatal("background sweep did not drop the expired key")
		}
		s.Close()
		s.Close() // idempotent
	})
}

func BenchmarkTake(b *testing.B) {
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket, algo.Concurrency} {
		b.Run(algotest.KindName(k), func(b *testing.B) {
			s := newStore(b, memory.Options{})
			l := algo.Limit{Kind: k, Rate: 100, Period: time.Second}
			var n atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprint("k", n.Add(1))
				hits := []algo.Hit{hit(key, l)}
				for pb.Next() {
					if _, err := algotest.Take(context.Background(), s, hits); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkBytesPerKey measures the heap held per stored key (entry, key
// bytes of a 39-byte key, index slot, heap item, and the log of the
// log-based algorithms, holding `fill` timestamps) at 100,000 keys for each
// algorithm; BenchmarkBytesPerKey1M measures 1,000,000 keys. Run:
//
//	go test ./pkg/backend/memory -run '^$' -bench BytesPerKey -benchtime 1x
func BenchmarkBytesPerKey(b *testing.B) {
	const keys = 100_000
	cases := []struct {
		name string
		l    algo.Limit
		fill int64
	}{
		{"fixed_window", algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Hour}, 1},
		{"sliding_window", algo.Limit{Kind: algo.SlidingWindow, Rate: 100, Period: time.Hour}, 1},
		{"token_bucket", algo.Limit{Kind: algo.TokenBucket, Rate: 100, Period: time.Hour}, 1},
		{"sliding_log_1", algo.Limit{Kind: algo.SlidingLog, Rate: 100, Period: time.Hour}, 1},
		{"sliding_log_100", algo.Limit{Kind: algo.SlidingLog, Rate: 100, Period: time.Hour}, 100},
		{"concurrency_10", algo.Limit{Kind: algo.Concurrency, Rate: 10, Period: time.Hour}, 10},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				s := newStore(b, memory.Options{SweepInterval: -1})
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for i := range keys {
					h := algo.Hit{Key: fmt.Sprintf("ratelimitd:domain:rule:%016x", i), Limit: c.l, Cost: c.fill}
					if _, err := algotest.Take(context.Background(), s, []algo.Hit{h}); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/keys, "bytes/key")
				runtime.KeepAlive(s)
			}
		})
	}
}

// TestMultiKeyStress: concurrent requests over overlapping key sets (in
// random order, so shard lock ordering matters) neither deadlock nor race,
// and every shared key admits exactly its limit.
func TestMultiKeyStress(t *testing.T) {
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Shards: 8, Now: c.now})
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Hour}
	keys := []string{"a", "b", "c", "d", "e", "f"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := map[string]int64{}
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				var hits []algo.Hit
				for j, k := range keys {
					if (g+i+j)%3 != 0 {
						hits = append(hits, hit(k, l))
					}
				}
				if (g+i)%2 == 0 { // reverse order
					for x, y := 0, len(hits)-1; x < y; x, y = x+1, y-1 {
						hits[x], hits[y] = hits[y], hits[x]
					}
				}
				d, err := algotest.Take(context.Background(), s, hits)
				if err != nil {
					t.Error(err)
					return
				}
				all := true
				for _, x := range d {
					all = all && x.Allowed
				}
				if all {
					mu.Lock()
					for _, h := range hits {
						admitted[h.Key]++
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for _, k := range keys {
		d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: k, Limit: l}})
		if err != nil {
			t.Fatal(err)
		}
		if admitted[k] > l.Rate || l.Rate-admitted[k] != d[0].Remaining {
			t.Errorf("key %s: %d admitted, remaining %d, rate %d", k, admitted[k], d[0].Remaining, l.Rate)
		}
	}
}

// TestFullStoreWorkPerCall counts the work of calls at a full store, not
// their time: keys dropped by eviction and shards' earliest expiries read
// (Store.Work). Whatever the number of keys: a new key with no slot
// (decided by the sketch) costs no eviction and at most one scan of the
// shards (none while no key can have expired), an admitted one exactly one
// eviction, a call on a stored key neither, and the sweep visits only
// expired keys.
func TestFullStoreWorkPerCall(t *testing.T) {
	const maxKeys, shards = 20_000, 64
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Now: c.now, MaxKeys: maxKeys, Shards: shards, SweepInterval: -1})
	minute := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Minute}
	hour := algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Hour}
	type work struct{ evicted, scanned int64 }
	take := func(l algo.Limit, keys ...string) ([]algo.Decision, work, error) {
		e0, s0 := s.Work()
		hits := make([]algo.Hit, len(keys))
		for i, k := range keys {
			hits[i] = hit(k, l)
		}
		d, err := algotest.Take(context.Background(), s, hits)
		e1, s1 := s.Work()
		return d, work{e1 - e0, s1 - s0}, err
	}
	for i := range maxKeys { // half expire after a minute, half after an hour
		l := minute
		if i%2 == 1 {
			l = hour
		}
		if _, _, err := take(l, fmt.Sprint("fill", i)); err != nil {
			t.Fatal(i, err)
		}
	}

	// nothing has expired: new keys are decided by the sketch with no
	// work on the stored keys; a stored key is decided exactly (it had 1
	// hit of 10)
	for i := range 5_000 {
		_, w, err := take(hour, fmt.Sprint("new", i))
		if err != nil || w != (work{}) {
			t.Fatalf("new key %d at a full store: %v, work %+v; want a decision and no work", i, err, w)
		}
		if i%500 == 0 {
			d, w, err := take(hour, "fill1")
			if want := int64(8 - i/500); err != nil || w != (work{}) || d[0].Allowed != (want >= 0) || d[0].Remaining != max(want, 0) {
				t.Fatalf("stored key, call %d: %+v %v, work %+v; want remaining %d", i/500, d, err, w, max(want, 0))
			}
		}
	}

	// half the keys expired: each new key drops exactly one
	c.add(time.Minute)
	for i := range maxKeys / 2 {
		_, w, err := take(hour, fmt.Sprint("late", i))
		if err != nil || w.evicted != 1 || w.scanned > shards {
			t.Fatalf("new key %d with expired keys stored: %v, work %+v; want 1 eviction, at most %d shards read", i, err, w, shards)
		}
	}
	if s.Len() != maxKeys {
		t.Fatalf("Len %d, want %d", s.Len(), maxKeys)
	}
	// full of live keys again: one scan finds that out, then none
	for i := range 1_000 {
		_, w, err := take(hour, fmt.Sprint("sketched", i))
		if err != nil || w.evicted != 0 || w.scanned > shards || i > 0 && w.scanned != 0 {
			t.Fatalf("new key %d at a full store: %v, work %+v", i, err, w)
		}
	}
	// a request of three new keys drops three, and is all-or-nothing
	c.add(time.Hour)
	if _, w, err := take(hour, "a", "b", "c"); err != nil || w.evicted != 3 || w.scanned > shards {
		t.Fatalf("three new keys: %v, work %+v", err, w)
	}
	// the sweep visits exactly the expired keys
	e0, _ := s.Work()
	s.Sweep()
	if e1, _ := s.Work(); e1-e0 != maxKeys-3 || s.Len() != 3 {
		t.Fatalf("sweep dropped %d keys, Len %d; want %d, 3", e1-e0, s.Len(), maxKeys-3)
	}
	e0, _ = s.Work()
	if s.Sweep(); s.Len() != 3 {
		t.Fatalf("Len %d", s.Len())
	}
	if e1, _ := s.Work(); e1 != e0 {
		t.Fatalf("a sweep with nothing expired dropped %d keys", e1-e0)
	}
}

// TestFloodKeepsStoredKeysExact: 8 goroutines flood unique short-lived
// keys at a small full store, moving the clock, so that new keys are both
// sketched and admitted by eviction; meanwhile 8 goroutines hit one stored
// key limited to 100: exactly 100 of its 400 hits pass, none fails, and the
// store never holds more than MaxKeys keys.
func TestFloodKeepsStoredKeysExact(t *testing.T) {
	const maxKeys = 200
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Now: c.now, MaxKeys: maxKeys, Shards: 8, SweepInterval: -1})
	hot := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: algo.MaxPeriod}
	flood := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Second}
	ctx := context.Background()
	if _, err := algotest.Take(ctx, s, []algo.Hit{{Key: "hot", Limit: hot}}); err != nil || s.Len() != 0 {
		t.Fatal(err) // a check stores nothing
	}
	if _, err := algotest.Take(ctx, s, []algo.Hit{hit("hot", hot)}); err != nil {
		t.Fatal(err)
	}
	for i := range maxKeys - 1 {
		if _, err := algotest.Take(ctx, s, []algo.Hit{hit(fmt.Sprint("fill", i), flood)}); err != nil {
			t.Fatal(err)
		}
	}
	var admitted, errs atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 8 {
		wg.Add(2)
		go func() { // flooder: 2,000 unique keys, the clock 100 ms on every 50
			defer wg.Done()
			<-start
			for i := range 2_000 {
				if i%50 == 49 {
					c.add(100 * time.Millisecond)
				}
				_, err := algotest.Take(ctx, s, []algo.Hit{hit(fmt.Sprintf("flood%d:%d", g, i), flood)})
				if err != nil {
					errs.Add(1)
				}
				if n := s.Len(); n > maxKeys {
					t.Errorf("Len %d above MaxKeys", n)
				}
			}
		}()
		go func() { // 50 hits on the stored key
			defer wg.Done()
			<-start
			for range 50 {
				d, err := algotest.Take(ctx, s, []algo.Hit{hit("hot", hot)})
				if err != nil {
					errs.Add(1)
				} else if d[0].Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	// the first hit above, then 99 of the 400
	if admitted.Load() != 99 || errs.Load() != 0 {
		t.Fatalf("stored key: %d of 400 admitted (want 99 after the first), %d errors", admitted.Load(), errs.Load())
	}
	// at most 500 new keys per clock second against room for 200
	if sk, _ := s.Approximated(); sk == 0 || sk == 16_000 {
		t.Fatalf("flood: %d of 16,000 keys sketched; want some sketched and some stored", sk)
	}
}
