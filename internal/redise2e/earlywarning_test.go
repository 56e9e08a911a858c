package redise2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

const earlyRules = `domain: early
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
`

// earlyClock is the simulated clock both instances and their Redis scripts
// read (redis.Options.Now pins the script's clock).
type earlyClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *earlyClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *earlyClock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// TestEarlyWarningRedis: two service instances on one Redis server, 40
// goroutines over 8 keys of a fixed-window and a sliding-window rule, 15
// calls per key and rule (limit 10) at 2 s into the window: every key crosses half of
// its limit exactly once over both instances, from the Redis script's
// answers alone; the same traffic at 30 s into the next window counts
// nothing.
func TestEarlyWarningRedis(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	clock := &earlyClock{now: time.Date(2026, 3, 1, 10, 0, 2, 0, time.UTC)}
	set := loadSet(t, earlyRules)
	var ins []*instance
	for range 2 {
		o := generous(standaloneOpts(srv.URL()))
		o.Now = clock.Now
		st := newStore(t, o)
		svc, reg := newService(t, service.Options{Store: st, Now: clock.Now}, set)
		ins = append(ins, &instance{svc: svc, store: st, reg: reg})
	}
	total := func(rule string) float64 {
		var n float64
		for _, in := range ins {
			n += counter(t, in.reg, "ratelimitd_early_warning_total", map[string]string{"domain": "early", "rule": rule})
		}
		return n
	}
	burst := func(round string) {
		var wg sync.WaitGroup
		for g := range 40 {
			in := ins[g%2]
			wg.Go(func() {
				// Goroutines g, g+8, ... share key g%8: 5 goroutines
				// × 3 calls = 15 calls on each key and rule (limit 10).
				for range 3 {
					key := fmt.Sprintf("%s-%d", round, g%8)
					call(t, in, req("early", []string{"fw", key}))
					call(t, in, req("early", []string{"sw", key}))
				}
			})
		}
		wg.Wait()
	}
	burst("a")
	if fw, sw := total("early.fw"), total("early.sw"); fw != 8 || sw != 8 {
		t.Errorf("2 s into the window: early warnings fw %v sw %v, want 8 and 8 (one per key)", fw, sw)
	}
	clock.Set(clock.Now().Add(88 * time.Second)) // 10:01:30
	burst("b")
	if fw, sw := total("early.fw"), total("early.sw"); fw != 8 || sw != 8 {
		t.Errorf("30 s into the window: early warnings fw %v sw %v, want still 8 and 8", fw, sw)
	}
}
