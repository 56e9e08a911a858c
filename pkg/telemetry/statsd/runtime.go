// gostats' Go runtime stats.

package statsd

import "runtime"

// AddRuntimeStats registers a generator that sets gostats' Go runtime
// stats under prefix (envoyproxy/ratelimit uses "ratelimit.go") at every
// flush: gauges alloc, sys, heapAlloc, heapSys, heapIdle, heapInuse,
// heapReleased, heapObjects, nextGC, lastGC, gcCPUPercent, numGoroutine,
// and counters totalAlloc, mallocs, frees, pauseTotalNs, numGC (their
// increase since the previous flush).
func (c *Client) AddRuntimeStats(prefix string) {
	p := prefix + "."
	g := func(n string) *Gauge { return c.Gauge(p + n) }
	alloc, sys, heapAlloc, heapSys := g("alloc"), g("sys"), g("heapAlloc"), g("heapSys")
	heapIdle, heapInuse, heapReleased, heapObjects := g("heapIdle"), g("heapInuse"), g("heapReleased"), g("heapObjects")
	nextGC, lastGC, gcCPU, goroutines := g("nextGC"), g("lastGC"), g("gcCPUPercent"), g("numGoroutine")
	type total struct {
		k    *Counter
		prev uint64
	}
	totals := map[string]*total{}
	for _, n := range []string{"totalAlloc", "mallocs", "frees", "pauseTotalNs", "numGC"} {
		totals[n] = &total{k: c.Counter(p + n)}
	}
	set := func(n string, v uint64) {
		t := totals[n]
		if v > t.prev {
			t.k.Add(v - t.prev)
		}
		t.prev = v
	}
	c.AddGenerator(func() {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		alloc.Set(m.Alloc)
		sys.Set(m.Sys)
		heapAlloc.Set(m.HeapAlloc)
		heapSys.Set(m.HeapSys)
		heapIdle.Set(m.HeapIdle)
		heapInuse.Set(m.HeapInuse)
		heapReleased.Set(m.HeapReleased)
		heapObjects.Set(m.HeapObjects)
		nextGC.Set(m.NextGC)
		lastGC.Set(m.LastGC)
		gcCPU.Set(uint64(m.GCCPUFraction * 100))
		goroutines.Set(uint64(runtime.NumGoroutine()))
		set("totalAlloc", m.TotalAlloc)
		set("mallocs", m.Mallocs)
		set("frees", m.Frees)
		set("pauseTotalNs", m.PauseTotalNs)
		set("numGC", uint64(m.NumGC))
	})
}
