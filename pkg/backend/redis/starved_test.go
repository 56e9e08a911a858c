package redis_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// busyLoops starts n child processes that spin on a CPU each, stopped at
// the end of the test.
func busyLoops(t testing.TB, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("busy loop: %v", err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
}

// cpuCgroup is a cgroup (v1 cpu controller) limited to quota of one CPU,
// made for the test, or an error saying why none can be made here.
type cpuCgroup struct{ dir, root string }

func newCPUCgroup(t testing.TB, quota float64) (*cpuCgroup, error) {
	root := "/sys/fs/cgroup/cpu"
	if _, err := os.Stat(filepath.Join(root, "cpu.cfs_quota_us")); err != nil {
		return nil, fmt.Errorf("no cgroup v1 cpu controller at %s: %w", root, err)
	}
	dir := filepath.Join(root, "ratelimitd-test-"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot make a cgroup: %w", err)
	}
	g := &cpuCgroup{dir: dir, root: root}
	t.Cleanup(func() { g.leave(t); _ = os.Remove(dir) })
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte("100000"), 0); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(int(quota*100000))), 0); err != nil {
		return nil, err
	}
	return g, nil
}

// enter moves this process (every thread) into the cgroup; leave moves
// it back to the root.
func (g *cpuCgroup) enter(t testing.TB) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		t.Fatalf("entering the cgroup: %v", err)
	}
}

func (g *cpuCgroup) leave(t testing.TB) {
	if b, err := os.ReadFile(filepath.Join(g.dir, "cpu.stat")); err == nil {
		t.Logf("cgroup %s: %s", g.dir, strings.ReplaceAll(string(b), "\n", " "))
	}
	_ = os.WriteFile(filepath.Join(g.root, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
}

// starvedTrials is how many times each case of TestRecoveryStarvedHost
// kills and restarts Redis.
const starvedTrials = 3

// TestRecoveryStarvedHost: Redis killed, the circuit open, then Redis
// restarted, with the CPUs saturated (two busy loops per core), and
// again with this process (the Store) in a cgroup limited to 0.2 CPU, and
// to 0.02 CPU (where a probe surely outlasts its first timeout).
// Without traffic after the restart, once Redis answers PING no health
// probe counts as Redis failing: the circuit does not open again (a probe
// that ran out of time while Redis answered is ratelimitd's slowness, not
// an outage), the probe alone makes the Store healthy, and decisions are
// counted. Each trial's recovery time (Redis answering to healthy) is
// logged; the 1 s bound on it is checked with the real binary by
// TestRecoveryStarved in internal/faults.
func TestRecoveryStarvedHost(t *testing.T) {
	redistest.Require(t)
	for _, starve := range []string{"busy_loops", "cgroup_0.2cpu", "cgroup_0.02cpu"} {
		t.Run(starve, func(t *testing.T) {
			var g *cpuCgroup
			if quota, ok := strings.CutPrefix(starve, "cgroup_"); ok {
				q, err := strconv.ParseFloat(strings.TrimSuffix(quota, "cpu"), 64)
				if err != nil {
					t.Fatal(err)
				}
				if g, err = newCPUCgroup(t, q); err != nil {
					t.Fatalf("a %v CPU cgroup cannot be made on this host: %v", q, err)
				}
			} else {
				busyLoops(t, 2*runtime.NumCPU())
			}
			var took []time.Duration
			for trial := range starvedTrials {
				d, reopened := starvedRecovery(t, g, trial)
				took = append(took, d)
				if reopened > 0 {
					t.Errorf("trial %d: the circuit opened %d more times after Redis answered PING: a probe counted a starved host as Redis failing", trial, reopened)
				}
			}
			slices.Sort(took)
			t.Logf("%s: counted again after Redis answered, %d trials: %v", starve, starvedTrials, took)
		})
	}
}

// starvedRecovery runs one trial of TestRecoveryStarvedHost: it returns
// how long after Redis answered PING a decision was counted, and how many
// times the circuit opened in between.
func starvedRecovery(t *testing.T, g *cpuCgroup, trial int) (time.Duration, uint64) {
	t.Helper()
	srv := redistest.Standalone(t)
	// The default options, with the breaker and the health probe on a
	// clock the test moves: each Tick is one probe iteration, whatever
	// the starvation does to the timer.
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	clk := clock.NewManual()
	s, err := redis.NewOnClock(o, clk)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	failWithTraffic(t, s, "killed")
	for range int(time.Second / redis.RecoveryPoll) { // down a second: probes fail (refused)
		clk.Tick(t)
	}
	srv.Restart() // answers PING
	answered := time.Now()
	opened := redis.BreakerOpened(s)
	if g != nil {
		g.enter(t)
		defer g.leave(t)
	}
	// No traffic: the health probe alone must find Redis back (as for
	// the next call 3 s later on a quiet route).
	for !s.Healthy() {
		if time.Since(answered) > stateWithin {
			t.Fatalf("trial %d: not healthy %v after Redis answered (circuit %s, %d openings since)", trial, stateWithin, s.BreakerState(), redis.BreakerOpened(s)-opened)
		}
		clk.Tick(t)
	}
	took := time.Since(answered)
	reopened := redis.BreakerOpened(s) - opened
	if g != nil {
		g.leave(t)
	}
	// Counted: the first Take on a fresh 1/hour key is allowed, the
	// second denied (no deadline of their own: --redis-max-wait).
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	key := "starved" + strconv.Itoa(trial)
	for i, want := range []bool{true, false} {
		d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: key, Limit: l, Cost: 1}})
		if err != nil {
			t.Fatalf("trial %d: Take %d once healthy: %v (cause %q)", trial, i, err, redis.CauseOf(err))
		}
		if d[0].Allowed != want {
			t.Fatalf("trial %d: Take %d allowed %v, want %v", trial, i, d[0].Allowed, want)
		}
	}
	return took, reopened
}
