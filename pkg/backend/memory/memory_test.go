package memory_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

var (
	_ service.Store  = (*memory.Store)(nil)
	_ service.Causer = memory.ErrFull.(service.Causer)
)

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
				d, err := s.Take(context.Background(), []algo.Hit{{Key: "k", Limit: l, Cost: 1}, {Key: "other", Limit: l, Cost: 0}})
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
		if _, err := s.Take(context.Background(), []algo.Hit{hit(fmt.Sprint("u", i), l)}); err != nil {
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
	if _, err := s.Take(context.Background(), []algo.Hit{{Key: "x", Limit: limits[0]}}); err != nil || s.Len() != 0 {
		t.Fatalf("check created a key: %v %d", err, s.Len())
	}
}

// TestLazyExpiry: an expired entry is not read back even before a sweep.
func TestLazyExpiry(t *testing.T) {
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Now: c.now, SweepInterval: -1})
	l := algo.Limit{Kind: algo.SlidingLog, Rate: 1, Period: time.Second}
	// an old log entry that the clock going back would otherwise revive is gone
	if d, _ := s.Take(context.Background(), []algo.Hit{hit("k", l)}); !d[0].Allowed {
		t.Fatal("first denied")
	}
	c.add(time.Second)
	if d, _ := s.Take(context.Background(), []algo.Hit{hit("k", l)}); !d[0].Allowed || d[0].Remaining != 0 {
		t.Fatalf("after expiry: %+v", d[0])
	}
	if s.Len() != 1 {
		t.Fatalf("Len %d", s.Len())
	}
}

func TestMaxKeys(t *testing.T) {
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Now: c.now, MaxKeys: 2, SweepInterval: -1})
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Minute}
	for _, k := range []string{"a", "b"} {
		if _, err := s.Take(context.Background(), []algo.Hit{hit(k, l)}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Take(context.Background(), []algo.Hit{hit("a", l), hit("c", l)})
	if !errors.Is(err, memory.ErrFull) {
		t.Fatalf("err %v, want ErrFull", err)
	}
	var ca service.Causer
	if !errors.As(err, &ca) || ca.Cause() != "oom" {
		t.Fatalf("cause of %v", err)
	}
	// the failed request wrote nothing: a still has 4
	d, err := s.Take(context.Background(), []algo.Hit{{Key: "a", Limit: l}})
	if err != nil || d[0].Remaining != 4 {
		t.Fatalf("a after failed request: %+v %v", d, err)
	}
	c.add(time.Minute)
	if _, err := s.Take(context.Background(), []algo.Hit{hit("c", l)}); err != nil {
		t.Fatalf("expired keys must make room: %v", err)
	}
}

func TestContextCanceled(t *testing.T) {
	s := newStore(t, memory.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, []algo.Hit{hit("k", algo.Limit{Rate: 1, Period: time.Second})}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

func TestBackgroundSweep(t *testing.T) {
	c := newClock(algotest.Base)
	s := newStore(t, memory.Options{Now: c.now, SweepInterval: time.Millisecond})
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 5, Period: time.Second}
	s.Take(context.Background(), []algo.Hit{hit("k", l)})
	c.add(time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("background sweep did not drop the expired key")
		}
		time.Sleep(time.Millisecond)
	}
	s.Close()
	s.Close() // idempotent
}

func BenchmarkTake(b *testing.B) {
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket, algo.Concurrency} {
		b.Run(kindName(k), func(b *testing.B) {
			s := newStore(b, memory.Options{})
			l := algo.Limit{Kind: k, Rate: 100, Period: time.Second}
			var n atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprint("k", n.Add(1))
				hits := []algo.Hit{hit(key, l)}
				for pb.Next() {
					if _, err := s.Take(context.Background(), hits); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkBytesPerKey measures the heap held per stored key (state, map
// entry and key string of ~40 bytes) for each algorithm, with the log-based
// ones holding `fill` entries. Run:
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
					if _, err := s.Take(context.Background(), []algo.Hit{h}); err != nil {
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

func kindName(k algo.Kind) string {
	return [...]string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "concurrency"}[k]
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
				d, err := s.Take(context.Background(), hits)
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
		d, err := s.Take(context.Background(), []algo.Hit{{Key: k, Limit: l}})
		if err != nil {
			t.Fatal(err)
		}
		if admitted[k] > l.Rate || l.Rate-admitted[k] != d[0].Remaining {
			t.Errorf("key %s: %d admitted, remaining %d, rate %d", k, admitted[k], d[0].Remaining, l.Rate)
		}
	}
}
