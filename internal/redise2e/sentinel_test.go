package redise2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// normalRun is how many normal answers in a row, all started after the
// promotion, TestSentinelFailoverThroughService waits for (at most
// stateWithin) before it stops the load: the service is on the new master.
const normalRun = 200

// sentinelTimeout replaces DefaultTimeout (10 ms) in
// TestSentinelFailoverThroughService: a SIGKILLed master refuses calls at
// once, so the failover path is the same with either value, while a
// scheduling stall past 10 ms would open the circuit and count as a
// failover failure. The failure-mode tests cover the 10 ms budget.
const sentinelTimeout = 200 * time.Millisecond

// TestSentinelFailoverThroughService: 4 goroutines call the service
// (Sentinel mode, Timeout sentinelTimeout) on closed-mode rules with fresh
// values, so an OK proves Redis decided; the master is SIGKILLed. After
// the promotion answers turn normal and stay so (no connection stuck on
// the old master or on READONLY): normalRun normal answers in a row, and
// at least 100 after the last failure, and at least one failure while the
// master was dead. The assertions are on these counts; the time to recover
// is a timing figure and goes to the test log.
func TestSentinelFailoverThroughService(t *testing.T) {
	redistest.Require(t)
	g := redistest.Sentinel(t)
	o := redis.DefaultOptions()
	o.URL = ""
	o.Mode = redis.Sentinel
	o.Addrs = g.SentinelAddrs()
	o.MasterName = redistest.MasterName
	o.Timeout = sentinelTimeout
	in := newInstance(t, o, failureSet(t))
	warm(t, []*instance{in})

	type obs struct {
		at time.Time
		ok bool
	}
	var promoted atomic.Int64 // the promotion, UnixNano; 0 before
	var run atomic.Int64      // normal answers in a row started after the promotion
	stop := make(chan struct{})
	res := make(chan []obs, 4)
	for range 4 {
		go func() {
			var out []obs
			for {
				select {
				case <-stop:
					res <- out
					return
				default:
				}
				at := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := in.svc.ShouldRateLimit(ctx, req("load", []string{"closed", freshValue()}))
				cancel()
				if err != nil {
					t.Errorf("ShouldRateLimit: %v", err) // never an error, even with the master dead
				}
				good := err == nil && isOK(r)
				out = append(out, obs{at, good})
				if p := promoted.Load(); p != 0 && at.UnixNano() > p {
					if good {
						run.Add(1)
					} else {
						run.Store(0)
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	killedAt := time.Now()
	old := g.KillMaster()
	g.WaitFailover(old, redistest.FailoverWithin)
	promotedAt := time.Now()
	promoted.Store(promotedAt.UnixNano())
	waitFor(t, stateWithin, "normal answers after the promotion", func() bool { return run.Load() >= normalRun })
	close(stop)
	var all []obs
	for range 4 {
		all = append(all, <-res...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })

	var lastFail time.Time
	var firstFail time.Time
	failed, okAfter := 0, 0
	var fails []time.Time
	for _, o := range all {
		if !o.ok {
			fails = append(fails, o.at)
			if firstFail.IsZero() {
				firstFail = o.at
			}
			lastFail = o.at
			failed++
		}
	}
	for _, o := range all {
		if o.ok && o.at.After(lastFail) {
			okAfter++
		}
	}
	t.Logf("failed calls per 250 ms after the kill: %s", failureTimeline(fails, killedAt, 250*time.Millisecond))
	t.Logf("master killed; sentinels promoted the replica after %v; %d of %d calls failed over (first %v after the kill, last %v after the kill = %v after the promotion); %d normal answers after the last failure; backend errors %v",
		promotedAt.Sub(killedAt).Round(time.Millisecond), failed, len(all),
		firstFail.Sub(killedAt).Round(time.Millisecond), lastFail.Sub(killedAt).Round(time.Millisecond),
		lastFail.Sub(promotedAt).Round(time.Millisecond), okAfter, causes(t, in.reg))
	if failed == 0 {
		t.Error("no call failed while the master was dead: the test did not observe the outage")
	}
	if okAfter < 100 {
		t.Errorf("only %d normal answers after the last failure", okAfter)
	}
}

// failureTimeline renders the instants fails as "offset:count" per step
// after from (steps without failures omitted), so that a failure report
// shows whether the failures were one outage or scattered.
func failureTimeline(fails []time.Time, from time.Time, step time.Duration) string {
	counts := map[time.Duration]int{}
	var keys []time.Duration
	for _, at := range fails {
		k := at.Sub(from)
		k -= ((k % step) + step) % step // floor, also before from
		if counts[k] == 0 {
			keys = append(keys, k)
		}
		counts[k]++
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%v:%d", k, counts[k])
	}
	return strings.Join(parts, " ")
}

// failoverRules: one key with a limit no test reaches, failure_mode
// closed, so that an OK answer means Redis counted the hit. The window is
// a (365-day) year, so that a run never spans a window boundary, where
// the count would start again.
const failoverRules = `
domain: failover
descriptors:
  - key: tenant
    rate_limit: {unit: year, requests_per_unit: 1000000, failure_mode: closed}
`

// manualFailover runs a steady load on one key while a sentinel performs
// SENTINEL FAILOVER, then returns how many calls Redis admitted (OK) and
// how many hits the new master holds for the key.
func manualFailover(t *testing.T, g *redistest.SentinelGroup, waitReplicas int) (admitted, counted int64, errs map[string]float64) {
	t.Helper()
	o := redis.DefaultOptions()
	o.WaitReplicas = waitReplicas
	o.URL = ""
	o.Mode = redis.Sentinel
	o.Addrs = g.SentinelAddrs()
	o.MasterName = redistest.MasterName
	in := newInstance(t, o, loadSet(t, failoverRules))
	warm(t, []*instance{in})
	value := freshValue()
	r := req("failover", []string{"tenant", value})
	var ok atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				resp, err := in.svc.ShouldRateLimit(ctx, r)
				cancel()
				if err == nil && isOK(resp) {
					ok.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	old := g.Master()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := g.Sentinels[0].Do(ctx, "SENTINEL", "FAILOVER", redistest.MasterName); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	g.WaitFailover(old, redistest.FailoverWithin)
	// Let the old master be reconfigured as a replica of the new one, and
	// traffic run on the new master for a while: 3 s and 100 admitted
	// calls (a count, so that a slow run does as much of it as a fast one).
	from, promoted := ok.Load(), time.Now()
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopLoad)
	waitFor(t, stateWithin, "3 s and 100 calls admitted after the promotion", func() bool {
		return time.Since(promoted) >= 3*time.Second && ok.Load()-from >= 100
	})
	stopLoad()
	final := call(t, in, r)
	for start := time.Now(); !isOK(final); final = call(t, in, r) {
		if time.Since(start) > stateWithin {
			t.Fatalf("final call still not decided after %v: %v (backend errors %v)", stateWithin, final, causes(t, in.reg))
		}
		time.Sleep(50 * time.Millisecond)
	}
	remaining := int64(final.GetStatuses()[0].GetLimitRemaining())
	return ok.Load(), 1000000 - remaining - 1, causes(t, in.reg)
}

// TestSentinelManualFailoverLosesNothing: with --redis-wait-replicas 1 and
// min-replicas-to-write 1 (as docs/redis-operations.md recommends), a
// planned SENTINEL FAILOVER under steady load loses no counted hit: every
// OK answer (failure_mode closed) is in the new master's counter. Hits
// refused or unacknowledged meanwhile get the rule's failure mode,
// metered; the master change is counted.
func TestSentinelManualFailoverLosesNothing(t *testing.T) {
	redistest.Require(t)
	g := redistest.Sentinel(t, redistest.WithArgs("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"))
	admitted, counted, errs := manualFailover(t, g, 1)
	t.Logf("manual failover, wait-replicas 1, min-replicas-to-write 1: %d admitted (counted by Redis), %d in the new master's counter; backend errors %v", admitted, counted, errs)
	if counted < admitted {
		t.Errorf("the new master counts %d hits, %d were admitted as counted: %d lost", counted, admitted, admitted-counted)
	}
}
