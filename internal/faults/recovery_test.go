package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// recoveryYAML has one rule per failure mode, each far from its limit, so
// that every call the store decides is OK and every call its failure mode
// answers is OK without a RateLimit header (open) or OVER_LIMIT (closed).
const recoveryYAML = `domain: ` + domain + `
descriptors:
  - key: open
    rate_limit: {unit: day, requests_per_unit: 1000000000, failure_mode: open}
  - key: closed
    rate_limit: {unit: day, requests_per_unit: 1000000000, failure_mode: closed}
`

// recoveryBound is how soon after Redis answers PING again ratelimitd
// must count again (its backend healthy).
const recoveryBound = time.Second

// recoveryEvery is the period of each rule's calls during a trial.
const recoveryEvery = 50 * time.Millisecond

// recoveryDeadline is each call's deadline: generous, so that a call the
// starved ratelimitd answers late still has an answer to classify.
const recoveryDeadline = 2 * time.Second

// recoveryDown is how long Redis stays down in a trial.
const recoveryDown = 2 * time.Second

// recoveryTrials is how many times each case of TestRecoveryStarved kills
// and restarts Redis (2 with -short).
func recoveryTrials() int {
	if testing.Short() {
		return 2
	}
	return 5
}

// cpuCgroup is a cgroup of the v1 cpu controller, made for a test, whose
// processes share quota of one CPU.
type cpuCgroup struct{ dir string }

// cpuRoot is where the v1 cpu controller is mounted.
const cpuRoot = "/sys/fs/cgroup/cpu"

// newCPUCgroup makes a cgroup limited to quota CPUs, removed when t ends,
// or returns why none can be made here.
func newCPUCgroup(t testing.TB, quota float64) (*cpuCgroup, error) {
	return newCgroup(t, fmt.Sprintf("%.2f CPU", quota), map[string]string{
		"cpu.cfs_period_us": "100000",
		"cpu.cfs_quota_us":  strconv.Itoa(int(quota * 100000)),
	})
}

// redisShares is the cpu.shares (the v1 controller's largest) of the
// cgroup Redis runs in when only ratelimitd is to be starved: Redis gets a
// CPU as soon as it is runnable, as on a machine of its own.
const redisShares = 262144

// newCgroup makes a cgroup of the v1 cpu controller with settings (file:
// value), removed when t ends, or returns why none can be made here.
func newCgroup(t testing.TB, what string, settings map[string]string) (*cpuCgroup, error) {
	if _, err := os.Stat(filepath.Join(cpuRoot, "cpu.cfs_quota_us")); err != nil {
		return nil, fmt.Errorf("no cgroup v1 cpu controller: %w", err)
	}
	dir := filepath.Join(cpuRoot, "ratelimitd-faults-"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	g := &cpuCgroup{dir: dir}
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(dir, "cpu.stat")); err == nil {
			t.Logf("cgroup %s: %s", what, strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", ", "))
		}
		// Move what is left back to the root, then remove the group.
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, pid := range strings.Fields(string(b)) {
				_ = os.WriteFile(filepath.Join(cpuRoot, "cgroup.procs"), []byte(pid), 0)
			}
		}
		_ = os.Remove(dir)
	})
	for _, f := range slices.Sorted(maps.Keys(settings)) {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(settings[f]), 0); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// runDelay is how long process pid's main thread has waited for a CPU
// while runnable (the second field of /proc/pid/schedstat); 0 when it
// cannot be read.
func runDelay(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	ns, _ := strconv.ParseInt(f[1], 10, 64)
	return time.Duration(ns)
}

// add moves process pid (every thread) into the cgroup.
func (g *cpuCgroup) add(pid int) error {
	return os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// busyLoop starts a process that spins on a CPU until t ends, in g when
// not nil.
func busyLoop(t testing.TB, g *cpuCgroup) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	testproc.KillWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("busy loop: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if g != nil {
		if err := g.add(cmd.Process.Pid); err != nil {
			t.Fatalf("moving a busy loop into the cgroup: %v", err)
		}
	}
}

// answer is one call of a trial: when it was sent and answered, and how.
type answer struct {
	rule       string
	sent, back time.Time
	out        outcome
}

// failureMode reports whether the rule's failure mode answered a (the
// store did not decide it).
func (a answer) failureMode() bool {
	return (a.rule == "open" && a.out == okFailedOpen) || (a.rule == "closed" && a.out == overLimit)
}

// periodic calls each rule every recoveryEvery (each call in its own
// goroutine, as independent requests arrive) until stopped.
type periodic struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	got   []answer
}

func (f *fleet) startPeriodic() *periodic {
	p := &periodic{stopc: make(chan struct{})}
	for _, rule := range []string{"open", "closed"} {
		p.wg.Go(func() {
			tick := time.NewTicker(recoveryEvery)
			defer tick.Stop()
			for {
				select {
				case <-p.stopc:
					return
				case <-tick.C:
				}
				p.wg.Go(func() {
					sent := time.Now()
					resp, err := call(f.rls[0], rule, freshValue(), nil, recoveryDeadline)
					a := answer{rule: rule, sent: sent, back: time.Now(), out: classify(resp, err)}
					p.mu.Lock()
					p.got = append(p.got, a)
					p.mu.Unlock()
				})
			}
		})
	}
	return p
}

// sentSince is, of the rules, the fewest answered calls sent at or after
// t.
func (p *periodic) sentSince(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := map[string]int{"open": 0, "closed": 0}
	for _, a := range p.got {
		if !a.sent.Before(t) {
			n[a.rule]++
		}
	}
	return min(n["open"], n["closed"])
}

// stop ends the calls and returns every answer, in the order sent.
func (p *periodic) stop() []answer {
	close(p.stopc)
	p.wg.Wait()
	slices.SortFunc(p.got, func(a, b answer) int { return a.sent.Compare(b.sent) })
	return p.got
}

// pingAgain polls PING on srv (a new connection each time) every 5 ms
// until it answers, and returns when its answer arrived: Redis answered
// at or before then, so a test process descheduled meanwhile can only make
// what is measured from it look shorter, never longer.
func pingAgain(t testing.TB, srv *redistest.Server) time.Time {
	t.Helper()
	deadline := time.Now().Add(stateWithin)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		_, err := srv.Do(ctx, "PING")
		cancel()
		if err == nil {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis on %s did not answer PING within %v: %v\n%s", srv.Addr(), stateWithin, err, srv.LogTail(20))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// healthyLine is the message ratelimitd logs when its backend becomes
// healthy (decisions are counted again), stamped with its own clock.
const healthyLine = "backend healthy: decisions are counted"

// healthyAfter is the time of the first line of logs (ratelimitd's JSON
// log) saying the backend became healthy at or after t; false when none
// does.
func healthyAfter(logs string, t time.Time) (time.Time, bool) {
	for line := range strings.SplitSeq(logs, "\n") {
		var l struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != healthyLine || l.Time.Before(t) {
			continue
		}
		return l.Time, true
	}
	return time.Time{}, false
}

// recoveryAfterBound is how many calls of each rule sent recoveryBound or
// more after Redis answered PING a trial waits for (up to stateWithin),
// so that "no such call gets its failure mode" is never vacuous, however
// long the test process was descheduled.
const recoveryAfterBound = 5

// recoveryTrial kills Redis under periodic calls, starts it again (in
// redisIn) after recoveryDown, and returns how long after its first PING
// answer ratelimitd logged its backend healthy (negative: not logged),
// and the calls sent recoveryBound or more after that answer that got
// their failure mode. Both use ratelimitd's own times, so a descheduled
// test process cannot stretch them. Idle trials stop calling while Redis
// restarts, so that only the health probe can find it back.
func recoveryTrial(t *testing.T, f *fleet, srv *redistest.Server, idle bool, redisIn *cpuCgroup) (time.Duration, []answer, string) {
	t.Helper()
	p := f.startPeriodic()
	time.Sleep(300 * time.Millisecond) // counted before the outage
	srv.Kill()
	time.Sleep(recoveryDown)
	var got []answer
	if idle {
		got = p.stop()
	}
	restarted := time.Now()
	srv.Start()
	if redisIn != nil {
		if err := redisIn.add(srv.Pid()); err != nil {
			t.Fatalf("moving redis into the cgroup: %v", err)
		}
	}
	pinged := pingAgain(t, srv)
	waited := runDelay(srv.Pid())
	if idle {
		time.Sleep(time.Until(pinged.Add(recoveryBound)))
		p = f.startPeriodic()
	}
	time.Sleep(time.Until(pinged.Add(recoveryBound + time.Second)))
	for deadline := time.Now().Add(stateWithin); p.sentSince(pinged.Add(recoveryBound)) < recoveryAfterBound && time.Now().Before(deadline); {
		time.Sleep(recoveryEvery)
	}
	got = append(got, p.stop()...)
	first := time.Duration(-1)
	if at, ok := healthyAfter(f.procs[0].Logs(), restarted); ok {
		first = max(0, at.Sub(pinged))
	}
	var late []answer
	for _, a := range got {
		if a.failureMode() && a.sent.Sub(pinged) >= recoveryBound {
			late = append(late, a)
		}
	}
	if n := p.sentSince(pinged.Add(recoveryBound)); n < recoveryAfterBound {
		t.Fatalf("only %d calls per rule answered within %v of being sent %v after Redis answered PING", n, stateWithin, recoveryBound)
	}
	waited = runDelay(srv.Pid()) - waited
	return first, late, fmt.Sprintf("%s\nredis waited %v for a CPU from its PING answer to the end of the trial", timelineOf(got, pinged), waited.Round(time.Millisecond))
}

// timelineOf renders answers as runs of "offset:rule=outcome" from t0.
func timelineOf(got []answer, t0 time.Time) string {
	var parts []string
	last := ""
	for _, a := range got {
		s := fmt.Sprintf("%s=%d", a.rule, a.out)
		if a.failureMode() {
			s = a.rule + "=failure_mode"
		} else if a.out == okDecided {
			s = a.rule + "=counted"
		}
		if s != last {
			parts = append(parts, fmt.Sprintf("%v:%s", a.sent.Sub(t0).Round(time.Millisecond), s))
			last = s
		}
	}
	return strings.Join(parts, " ")
}

// warmRule makes calls on rule until one is counted (pool dialed, script
// loaded), failing after 20 s.
func warmRule(f *fleet, rule string) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := call(f.rls[0], rule, "warm-"+freshValue(), nil, 0)
		if classify(resp, err) == okDecided {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no call on %s counted within 20s (last: %v, %v)\n%s", rule, resp, err, f.logs(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRecoveryStarved: Redis under one `ratelimitd serve` (default flags,
// an open and a closed rule each called every 50 ms) is killed and
// restarted recoveryTrials times while busy loops saturate every CPU, in
// some cases with ratelimitd (once Redis too) in a 0.2-CPU cgroup. Each
// time ratelimitd logs its backend healthy within 1 s of Redis answering
// PING, and no call sent 1 s or more after that answer gets its failure
// mode (a missed deadline is DEADLINE_EXCEEDED, not a failure mode).
// Outside the "with_redis" cases Redis gets the largest CPU weight, so
// that only ratelimitd is starved. The test fails where no cgroup can be
// made.
func TestRecoveryStarved(t *testing.T) {
	redistest.Require(t)
	for _, c := range []struct {
		name    string
		cgroup  bool
		persist bool
		idle    bool
		redis   bool // Redis in the cgroup too
	}{
		{"busy_loops", false, false, false, false},
		{"busy_loops/idle", false, false, true, false},
		{"busy_loops_cgroup_0.2cpu", true, false, false, false},
		{"busy_loops_cgroup_0.2cpu/idle", true, false, true, false},
		{"busy_loops_cgroup_0.2cpu_aof/idle", true, true, true, false},
		{"busy_loops_cgroup_0.2cpu_with_redis", true, false, false, true},
		{"busy_loops_cgroup_0.2cpu_with_redis/idle", true, false, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var opts []redistest.Option
			if c.persist {
				opts = append(opts, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "everysec"))
			}
			srv := redistest.Standalone(t, opts...)
			cfg := t.TempDir()
			if err := os.WriteFile(filepath.Join(cfg, "recovery.yaml"), []byte(recoveryYAML), 0o600); err != nil {
				t.Fatal(err)
			}
			f := startFleet(t, 1, cfg, standaloneBackend("standalone", srv))
			warmRule(f, "open")
			var redisIn *cpuCgroup
			if c.cgroup {
				g, err := newCPUCgroup(t, 0.2)
				if err != nil {
					t.Fatalf("a 0.2 CPU cgroup cannot be made on this host: %v", err)
				}
				if err := g.add(f.procs[0].Cmd.Process.Pid); err != nil {
					t.Fatalf("moving ratelimitd into the cgroup: %v", err)
				}
				// A neighbour in the cgroup (another container of the
				// pod) uses its quota, so that ratelimitd is throttled.
				busyLoop(t, g)
				if c.redis {
					redisIn = g
				}
			}
			if redisIn == nil {
				g, err := newCgroup(t, "redis", map[string]string{"cpu.shares": strconv.Itoa(redisShares)})
				if err != nil {
					t.Fatalf("a cgroup for redis cannot be made on this host: %v", err)
				}
				redisIn = g
			}
			if err := redisIn.add(srv.Pid()); err != nil {
				t.Fatalf("moving redis into its cgroup: %v", err)
			}
			for range 2 * runtime.NumCPU() {
				busyLoop(t, nil)
			}
			var took []time.Duration
			for trial := range recoveryTrials() {
				first, late, tl := recoveryTrial(t, f, srv, c.idle, redisIn)
				took = append(took, first)
				if first < 0 || first > recoveryBound || len(late) > 0 {
					t.Errorf("trial %d: backend healthy again %v after Redis answered PING by ratelimitd's log (want within %v; negative: not logged); %d calls sent %v or more after it answered by their failure mode\ncalls: %s\nbackend errors: %v\n%s",
						trial, first, recoveryBound, len(late), recoveryBound, tl, f.backendErrors(), f.logs(20))
				}
			}
			t.Logf("%s: backend healthy again after Redis answered PING, %d trials: %v", c.name, len(took), took)
		})
	}
}
