package memory_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// BenchmarkFloodFull measures calls on existing keys while 8 goroutines
// flood unique keys at a store holding MaxKeys (1,000,000, the
// --memory-max-keys default) keys. Each b.N iteration is one single-hit
// Take on one of 1,000 existing keys, timed alone; p50/p99/max are those
// latencies. Cases:
//
//	live   every stored key is live (100-year window): each flood key is
//	       decided by its window's sketch
//	churn  the filler and flood keys use a 10 ms window: each flood key
//	       evicts an expired one
//
// Run (a few seconds per case, most of it filling the store):
//
//	go test ./pkg/backend/memory -run '^$' -bench FloodFull -benchtime 20000x
func BenchmarkFloodFull(b *testing.B) {
	const (
		maxKeys  = 1_000_000
		hot      = 1_000
		flooders = 8
	)
	forever := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 50, Period: algo.MaxPeriod}
	for _, c := range []struct {
		name  string
		flood algo.Limit
	}{
		{"live", forever},
		{"churn", algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: 10 * time.Millisecond}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := newStore(b, memory.Options{MaxKeys: maxKeys})
			ctx := context.Background()
			for i := range maxKeys {
				k, l := fmt.Sprintf("fill:%016x", i), c.flood
				if i < hot {
					k, l = fmt.Sprintf("hot:%016x", i), forever
				}
				if _, err := algotest.Take(ctx, s, []algo.Hit{hit(k, l)}); err != nil {
					b.Fatal(i, err)
				}
			}
			var flood atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := range flooders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					hits := []algo.Hit{hit("", c.flood)}
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						hits[0].Key = "flood:" + strconv.Itoa(g) + ":" + strconv.Itoa(i)
						if _, err := algotest.Take(ctx, s, hits); err != nil {
							b.Error(err)
							return
						}
						flood.Add(1)
					}
				}()
			}
			time.Sleep(50 * time.Millisecond) // flooders running
			lat := make([]time.Duration, b.N)
			hits := []algo.Hit{hit("", forever)}
			f0 := flood.Load()
			start := time.Now()
			b.ResetTimer()
			for i := range b.N {
				hits[0].Key = fmt.Sprintf("hot:%016x", i%hot)
				t0 := time.Now()
				d, err := algotest.Take(ctx, s, hits)
				lat[i] = time.Since(t0)
				if err != nil || !d[0].Allowed {
					b.Fatalf("existing key %s: %+v %v", hits[0].Key, d, err)
				}
			}
			b.StopTimer()
			el := time.Since(start)
			f1 := flood.Load()
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			b.ReportMetric(us(lat[len(lat)/2]), "p50-µs")
			b.ReportMetric(us(lat[len(lat)*99/100]), "p99-µs")
			b.ReportMetric(us(lat[len(lat)-1]), "max-µs")
			b.ReportMetric(float64(f1-f0)/el.Seconds(), "flood-calls/s")
			if f := flood.Load(); f > 0 {
				sk, _ := s.Approximated()
				b.ReportMetric(100*float64(sk)/float64(f), "flood-sketched-%")
			}
			if s.Len() > maxKeys {
				b.Errorf("Len %d above MaxKeys %d", s.Len(), maxKeys)
			}
		})
	}
}

// BenchmarkBytesPerKey1M measures the memory held per key at 1,000,000
// fixed-window keys: the live heap growth after GC (HeapAlloc) and the
// growth of the process's resident set (VmRSS, Linux; it includes the
// garbage the GC target lets accumulate) divided by the number of keys.
// Keys are 22 bytes (the length of a hashed policy key with no prefix) or
// 39 bytes. Run:
//
//	go test ./pkg/backend/memory -run '^$' -bench BytesPerKey1M -benchtime 1x
func BenchmarkBytesPerKey1M(b *testing.B) {
	const keys = 1_000_000
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Hour}
	for _, c := range []struct {
		name string
		key  func(i int) string
	}{
		{"key22", func(i int) string { return fmt.Sprintf("%022x", i) }},
		{"key39", func(i int) string { return fmt.Sprintf("ratelimitd:domain:rule:%016x", i) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				s := newStore(b, memory.Options{SweepInterval: -1})
				var before, after runtime.MemStats
				debug.FreeOSMemory() // the previous case's heap back to the OS
				runtime.ReadMemStats(&before)
				rss0 := vmRSS()
				hits := []algo.Hit{hit("", l)}
				for i := range keys {
					hits[0].Key = c.key(i)
					if _, err := algotest.Take(context.Background(), s, hits); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/keys, "heap-bytes/key")
				if rss0 > 0 {
					b.ReportMetric(float64(vmRSS()-rss0)/keys, "rss-bytes/key")
				}
				runtime.KeepAlive(s)
				s.Close()
			}
		})
	}
}

// vmRSS returns the resident set size in bytes from /proc/self/status, or
// 0 when it cannot be read.
func vmRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
