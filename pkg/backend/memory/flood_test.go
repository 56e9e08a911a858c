package memory_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// TestFloodDoesNotFreeNewKeys: a flood of unique keys on one limit fills a
// store of 64 keys (none expires), then goes on (200 more keys, 8
// goroutines) while 30 goroutines each send one hit of a victim key that
// arrives after the store is full, on the same 10-per-hour limit. The
// victim admits exactly 10 of 30 with every algorithm a sketch decides
// (fixed window, sliding window, token bucket) and none with the others
// (sliding log, concurrency: refused while no slot is free). No call
// fails, and the store never holds more than its bound.
func TestFloodDoesNotFreeNewKeys(t *testing.T) {
	const maxKeys, extra, victims = 64, 200, 30
	for _, c := range []struct {
		kind algo.Kind
		want int64
	}{
		{algo.FixedWindow, 10},
		{algo.SlidingWindow, 10},
		{algo.TokenBucket, 10},
		{algo.SlidingLog, 0},
		{algo.Concurrency, 0},
	} {
		t.Run(kindName[c.kind], func(t *testing.T) {
			clk := newClock(algotest.Base.Add(17 * time.Minute))
			s := newStore(t, memory.Options{Now: clk.now, MaxKeys: maxKeys, Shards: 8, SweepInterval: -1})
			l := algo.Limit{Kind: c.kind, Rate: 10, Period: time.Hour}
			ctx := context.Background()
			for i := range maxKeys {
				if _, err := algotest.Take(ctx, s, []algo.Hit{hit(fmt.Sprint("fill", i), l)}); err != nil {
					t.Fatal(i, err)
				}
			}
			var admitted, flooded, errs atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for i := range extra / 8 {
						d, err := algotest.Take(ctx, s, []algo.Hit{hit(fmt.Sprintf("flood%d:%d", g, i), l)})
						switch {
						case err != nil:
							errs.Add(1)
						case d[0].Allowed:
							flooded.Add(1)
						}
					}
				}()
			}
			for range victims {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					d, err := algotest.Take(ctx, s, []algo.Hit{hit("victim", l)})
					switch {
					case err != nil:
						errs.Add(1)
					case d[0].Allowed:
						admitted.Add(1)
					case d[0].RetryAfter <= 0:
						t.Errorf("denied without RetryAfter: %+v", d[0])
					}
				}()
			}
			close(start)
			wg.Wait()
			if errs.Load() != 0 {
				t.Errorf("%d calls failed; a full store must decide every call", errs.Load())
			}
			if got := admitted.Load(); got != c.want {
				t.Errorf("victim admitted %d of %d after the store filled, want %d", got, victims, c.want)
			}
			if s.Len() > maxKeys {
				t.Errorf("Len %d above MaxKeys %d", s.Len(), maxKeys)
			}
			sk, ref := s.Approximated()
			t.Logf("flood keys admitted %d of %d; sketched %d, refused %d", flooded.Load(), extra, sk, ref)
			// every key stays limited: a flood key's second hits are
			// counted too (10 per key)
			k := "flood0:0"
			n := 0
			for range 20 {
				if d, err := algotest.Take(ctx, s, []algo.Hit{hit(k, l)}); err == nil && d[0].Allowed {
					n++
				}
			}
			if n > 9 {
				t.Errorf("flood key %s admitted %d more after its first hit, want at most 9", k, n)
			}
		})
	}
}

// TestFloodManyKeysStaysConservative: 8 goroutines each hit 400 keys of
// their own 15 times over (48,000 hits on 3,200 keys) at a store of 64
// keys, on a 10-per-hour limit, with a small sketch (2 rows of 64 cells)
// that they saturate: no key is ever admitted more than 10 times, even
// though the sketch cannot tell them apart.
func TestFloodManyKeysStaysConservative(t *testing.T) {
	for _, kind := range []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.TokenBucket} {
		t.Run(kindName[kind], func(t *testing.T) {
			clk := newClock(algotest.Base)
			s := newStore(t, memory.Options{Now: clk.now, MaxKeys: 64, Shards: 4, SweepInterval: -1, SketchWidth: 64, SketchDepth: 2})
			l := algo.Limit{Kind: kind, Rate: 10, Period: time.Hour}
			ctx := context.Background()
			const keys, goroutines, rounds = 400, 8, 15
			var admitted [goroutines][keys]int
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range rounds {
						for i := range keys {
							d, err := algotest.Take(ctx, s, []algo.Hit{hit(fmt.Sprintf("g%d:%d", g, i), l)})
							if err != nil {
								t.Error(err)
								return
							}
							if d[0].Allowed {
								admitted[g][i]++
							}
						}
					}
				}()
			}
			wg.Wait()
			total := 0
			for g := range goroutines {
				for i := range keys {
					total += admitted[g][i]
					if admitted[g][i] > 10 {
						t.Fatalf("key g%d:%d admitted %d times on a 10-per-hour limit", g, i, admitted[g][i])
					}
				}
			}
			t.Logf("%d of %d hits admitted", total, goroutines*keys*rounds)
		})
	}
}

var kindName = map[algo.Kind]string{
	algo.FixedWindow: "fixed_window", algo.SlidingWindow: "sliding_window", algo.SlidingLog: "sliding_log",
	algo.TokenBucket: "token_bucket", algo.Concurrency: "concurrency",
}
