package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// envoyDeadline is the default timeout of Envoy's HTTP rate-limit filter:
// the deadline of the bursts that model Envoy's calls.
const envoyDeadline = 20 * time.Millisecond

// shape is one kind of burst: c concurrent calls on one fresh key with
// limit l, each with deadline (0: the caller sets none).
type shape struct {
	c, l     int
	deadline time.Duration
}

func (s shape) String() string {
	d := "nodeadline"
	if s.deadline > 0 {
		d = "deadline" + s.deadline.String()
	}
	return fmt.Sprintf("c%d_l%d_%s", s.c, s.l, d)
}

// shapes are the bursts of TestBursts: few callers on a roomy limit, many
// callers on a tight one; without and with Envoy's deadline.
var shapes = []shape{
	{60, 30, 0}, {500, 10, 0},
	{60, 30, envoyDeadline}, {500, 10, envoyDeadline},
}

// patientArgs are the flags of the fleets of TestBursts and TestFaults on
// top of the defaults: a call without a deadline gets a budget of 20 s
// instead of --redis-max-wait's 1 s, so that such calls (whose answers
// must be exact: every one decided, exactly the limit OK) are decided by
// the store, never shed when busy loops and -race make a call take over a
// second. Calls with Envoy's 20 ms deadline keep their deadline.
var patientArgs = []string{"--redis-max-wait=20s"}

// fleetSize is the number of instances a burst is spread over.
const fleetSize = 3

// burstReps is how often each shape runs per topology, load and instance
// state: 20 times with RATELIMITD_LONG=1 (`make test-long`), else
// (`make test`) once on fresh fleets and 3 times on warm ones.
func burstReps(fresh bool) int {
	if fresh {
		return testproc.Reps(1, 20)
	}
	return testproc.Reps(3, 20)
}

// topology starts a Redis deployment for a test.
type topology struct {
	name  string
	start func(testing.TB) backend
}

var topologies = []topology{
	{"standalone", func(t testing.TB) backend {
		return standaloneBackend("standalone", redistest.Standalone(t))
	}},
	{"tls13", func(t testing.TB) backend {
		// TLS 1.3 only, so that every connection negotiates it.
		return standaloneBackend("tls13", redistest.Standalone(t, redistest.WithTLS(), redistest.WithArgs("--tls-protocols", "TLSv1.3")))
	}},
	{"sentinel", func(t testing.TB) backend { return sentinelBackend(redistest.Sentinel(t)) }},
	{"cluster", func(t testing.TB) backend { return clusterBackend(redistest.Cluster(t, 3)) }},
}

// burstLog collects one shape's results across repetitions.
type burstLog struct {
	admitted, failedOpen, consumed []int
}

func (l *burstLog) String() string {
	return fmt.Sprintf("admitted %s; failed open %s; counted %s", intsString(l.admitted), intsString(l.failedOpen), intsString(l.consumed))
}

// runShape sends one burst of sh on a fresh key over f, reads what the
// store counted (a check-only call) and asserts: without a deadline, every
// call answered, exactly sh.l OK and sh.l counted; with one, no more OK
// than counted (an OK the store did not count is an over-admission), and
// never more counted than sh.l. what names the burst in failures.
func runShape(t *testing.T, f *fleet, sh shape, what string, log *burstLog) {
	t.Helper()
	key := fmt.Sprintf("l%d", sh.l)
	value := freshValue()
	res := f.burst(key, value, sh.c, sh.deadline)
	consumed := sh.l - int(f.remaining(0, key, value))
	log.admitted = append(log.admitted, res.ok())
	log.failedOpen = append(log.failedOpen, res.failedOpen)
	log.consumed = append(log.consumed, consumed)
	if sh.deadline == 0 {
		if res.ok() != sh.l || res.ok()+res.over != sh.c || consumed != sh.l {
			t.Errorf("%s %v: %v, store counted %d; want OK exactly %d, OVER_LIMIT %d, no error, %d counted; backend errors by cause %v\n%s",
				what, sh, res, consumed, sh.l, sh.c-sh.l, sh.l, f.backendErrors(), f.logs(20))
		}
		return
	}
	if res.ok() > consumed || consumed > sh.l {
		t.Errorf("%s %v: %v, store counted %d; want OK <= counted <= %d; backend errors by cause %v\n%s",
			what, sh, res, consumed, sh.l, f.backendErrors(), f.logs(20))
	}
}

// TestBursts: on each topology, with the CPUs idle and then pinned by two
// busy loops, bursts of every shape on 3 instances started for the burst
// (fresh: started, SERVING, then at once the burst; a fleet per burst) and
// on warm ones. The instances run with their default flags
// (--redis-timeout 10 ms) but patientArgs.
func TestBursts(t *testing.T) {
	redistest.Require(t)
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			b := topo.start(t)
			cfg := writeConfig(t)
			for _, load := range []string{"idle", "pinned"} {
				t.Run(load, func(t *testing.T) {
					if load == "pinned" {
						pinCPUs(t, 2)
					}
					t.Run("fresh", func(t *testing.T) { freshBursts(t, cfg, b) })
					t.Run("warm", func(t *testing.T) { warmBursts(t, cfg, b) })
				})
			}
		})
	}
}

// freshBursts runs burstReps(true) bursts of each shape, each on a fleet
// started for it: started, SERVING, then at once the burst.
func freshBursts(t *testing.T, cfg string, b backend) {
	logs := make([]burstLog, len(shapes))
	causes := map[string]float64{}
	var lifecycle time.Duration
	for rep := range burstReps(true) {
		awayFromWindowEnd(t, time.Minute)
		for i, sh := range shapes {
			t0 := time.Now()
			f := startFleet(t, fleetSize, cfg, b, patientArgs...)
			lifecycle += time.Since(t0)
			runShape(t, f, sh, fmt.Sprintf("fresh fleet, repetition %d:", rep+1), &logs[i])
			addCounts(causes, f.backendErrors())
			t0 = time.Now()
			f.stop()
			lifecycle += time.Since(t0)
		}
	}
	for i, sh := range shapes {
		t.Logf("%s fresh %v: %v", b.name, sh, &logs[i])
	}
	t.Logf("%s fresh: backend errors by cause %v; %v starting and stopping %d fleets", b.name, causes, lifecycle.Round(time.Millisecond), burstReps(true)*len(shapes))
}

// warmBursts runs burstReps(false) bursts of each shape on warmed fleets:
// one for the shapes without a deadline, another for those with Envoy's.
// The deadlined bursts' timeouts can open the circuit (a starved Redis
// looks frozen), which would shed the exact bursts' calls, so those run
// on a fleet of their own, each after waitHealthy.
func warmBursts(t *testing.T, cfg string, b backend) {
	var exact, deadlined []int
	for i, sh := range shapes {
		if sh.deadline == 0 {
			exact = append(exact, i)
		} else {
			deadlined = append(deadlined, i)
		}
	}
	logs := make([]burstLog, len(shapes))
	for _, idx := range [][]int{exact, deadlined} {
		f := startFleet(t, fleetSize, cfg, b, patientArgs...)
		for i := range f.rls {
			f.warm(i)
		}
		for rep := range burstReps(false) {
			awayFromWindowEnd(t, time.Minute)
			for _, i := range idx {
				if shapes[i].deadline == 0 {
					f.waitHealthy()
				}
				runShape(t, f, shapes[i], fmt.Sprintf("warm repetition %d:", rep+1), &logs[i])
			}
		}
		t.Logf("%s warm %s: backend errors by cause %v", b.name, shapesString(idx), f.backendErrors())
		f.stop()
	}
	for i, sh := range shapes {
		t.Logf("%s warm %v: %v", b.name, sh, &logs[i])
	}
}

// shapesString names the shapes of idx.
func shapesString(idx []int) string {
	s := make([]string, len(idx))
	for j, i := range idx {
		s[j] = shapes[i].String()
	}
	return strings.Join(s, ",")
}
