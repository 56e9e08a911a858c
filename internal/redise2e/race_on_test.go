//go:build race

package redise2e

// raceEnabled reports whether the race detector is on: it slows the whole
// decision path several times (TestFreshBurstDefaultOptions measured p50
// 4.2 ms and p99 16.3 ms at load average 1.1, against 1.2-1.4 ms and
// 2.8-6.1 ms without it), so latency budgets are not representative.
const raceEnabled = true
