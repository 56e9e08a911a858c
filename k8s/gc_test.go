package k8s_test

import (
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The heap per key of the in-memory store that docs/operations.md gives
// ("In-memory store"), and the default --memory-max-keys.
const (
	memoryStoreBytesPerKey = 128
	memoryMaxKeysDefault   = 1_000_000
)

// TestGoMemoryLimitFitsContainer checks the Go GC policy of every workload
// against its memory limit (docs/operations.md): the soft memory limit is a
// share of the container's limit below 1 (GOMEMLIMIT from limits.memory
// would be all of it and would override the share), and it leaves room for
// the in-memory store at its key bound twice over, so that a full store is
// not GC-thrashed against the limit.
func TestGoMemoryLimitFitsContainer(t *testing.T) {
	for _, dir := range workloads {
		t.Run(dir, func(t *testing.T) {
			_, c := ratelimitd(t, render(t, dir))
			lim, ok := c.Resources.Limits[corev1.ResourceMemory]
			if !ok {
				t.Fatal("no memory limit")
			}
			for _, e := range c.Env {
				if e.Name == "GOMEMLIMIT" || e.Name == "GOGC" {
					t.Errorf("%s is set: it overrides --memory-limit-ratio / --gc-percent (use RATELIMITD_MEMORY_LIMIT_RATIO, RATELIMITD_GC_PERCENT)", e.Name)
				}
				if e.Name == "RATELIMITD_MEMORY_LIMIT" {
					t.Errorf("RATELIMITD_MEMORY_LIMIT is set: keep the limit a share of the container's (RATELIMITD_MEMORY_LIMIT_RATIO)")
				}
			}
			ratio := 0.8 // --memory-limit-ratio default
			if v := envValue(c, "RATELIMITD_MEMORY_LIMIT_RATIO"); v != "" {
				var err error
				if ratio, err = strconv.ParseFloat(v, 64); err != nil {
					t.Fatalf("RATELIMITD_MEMORY_LIMIT_RATIO=%q: %v", v, err)
				}
			}
			if !(ratio > 0 && ratio < 1) {
				t.Errorf("memory limit ratio %v: want in (0, 1), leaving headroom under the container limit", ratio)
			}
			maxKeys := memoryMaxKeysDefault
			if v := envValue(c, "RATELIMITD_MEMORY_MAX_KEYS"); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("RATELIMITD_MEMORY_MAX_KEYS=%q: %v", v, err)
				}
				maxKeys = n
			}
			goLimit := float64(lim.Value()) * ratio
			if store := float64(maxKeys * memoryStoreBytesPerKey); maxKeys == 0 || goLimit < 2*store {
				t.Errorf("Go memory limit %.0f MiB (%v × %s) is under 2 × the in-memory store's bound (%d keys ≈ %.0f MiB); raise the memory limit or lower RATELIMITD_MEMORY_MAX_KEYS",
					goLimit/(1<<20), ratio, lim.String(), maxKeys, store/(1<<20))
			}
			if gc := envValue(c, "RATELIMITD_GC_PERCENT"); gc == "-1" {
				t.Errorf("RATELIMITD_GC_PERCENT=-1 turns the GC off: the heap would grow to the limit on every cycle")
			}
		})
	}
}
