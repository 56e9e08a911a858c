package overlimit

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// heapAlloc is the live heap after a full collection, in bytes.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestNewLargeBoundAllocatesLittle: New(1e9) must not allocate anything
// proportional to the bound (a map hint of 1e9 entries is tens of GB), and
// the cache still evicts at its bound once filled.
func TestNewLargeBoundAllocatesLittle(t *testing.T) {
	if allocs := testing.AllocsPerRun(10, func() { _ = New(1_000_000_000) }); allocs > 10 {
		t.Errorf("New(1e9): %v allocations, want at most 10", allocs)
	}
	before := heapAlloc()
	c := New(1_000_000_000)
	after := heapAlloc()
	if after > before && after-before > 1<<20 {
		t.Errorf("New(1e9) grew the live heap by %d bytes, want under 1 MiB", after-before)
	}
	base := time.Unix(1000, 0)
	c.add(cacheEntry{key: "a", until: base.Add(time.Second), cost: 1})
	if _, ok := c.lookup("a", algo.Limit{}, 1, base); !ok || c.Len() != 1 {
		t.Fatalf("entry not held in a large cache: len %d", c.Len())
	}
	runtime.KeepAlive(c)
}

// TestMemoryPerEntry bounds the memory one entry costs (the figure
// docs/redis.md gives: about 200 bytes plus the key), measured on 100 000
// entries with 40-byte keys.
func TestMemoryPerEntry(t *testing.T) {
	const n, keyLen = 100_000, 40
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%0*d", keyLen, i)
	}
	base := time.Unix(1000, 0)
	before := heapAlloc()
	c := New(n)
	for _, k := range keys {
		c.add(cacheEntry{key: k, until: base.Add(time.Second), cost: 1})
	}
	after := heapAlloc()
	if c.Len() != n {
		t.Fatalf("len %d, want %d", c.Len(), n)
	}
	perEntry := float64(after-before) / n
	t.Logf("%.0f bytes per entry (key bytes held by the caller)", perEntry)
	if perEntry > 400 {
		t.Errorf("%.0f bytes per entry, want at most 400", perEntry)
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(keys)
}
