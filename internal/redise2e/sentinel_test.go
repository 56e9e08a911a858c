package redise2e

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// sentinelBound: after the sentinels promote the replica, the service
// answers normally again within it ("errors stop within seconds").
const sentinelBound = 5 * time.Second

// TestSentinelFailoverThroughService: 4 goroutines call the service
// (production defaults, Sentinel mode) on closed-mode rules with fresh
// values, so an OK answer proves Redis decided; the master is SIGKILLed;
// after the promotion, answers are normal again within sentinelBound and
// stay normal (no connection stuck on the old master or on READONLY).
func TestSentinelFailoverThroughService(t *testing.T) {
	redistest.Require(t)
	g := redistest.Sentinel(t)
	o := redis.DefaultOptions()
	o.URL = ""
	o.Mode = redis.Sentinel
	o.Addrs = g.SentinelAddrs()
	o.MasterName = redistest.MasterName
	in := newInstance(t, o, failureSet(t))
	warm(t, []*instance{in})

	type obs struct {
		at time.Time
		ok bool
	}
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
				out = append(out, obs{at, err == nil && isOK(r)})
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	killedAt := time.Now()
	old := g.KillMaster()
	g.WaitFailover(old, 30*time.Second)
	promotedAt := time.Now()
	time.Sleep(sentinelBound + time.Second)
	close(stop)
	var all []obs
	for range 4 {
		all = append(all, <-res...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })

	var lastFail time.Time
	var firstFail time.Time
	failed, okAfter := 0, 0
	for _, o := range all {
		if !o.ok {
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
	t.Logf("master killed; sentinels promoted the replica after %v; %d of %d calls failed over (first %v after the kill, last %v after the kill = %v after the promotion); %d normal answers after the last failure; backend errors %v",
		promotedAt.Sub(killedAt).Round(time.Millisecond), failed, len(all),
		firstFail.Sub(killedAt).Round(time.Millisecond), lastFail.Sub(killedAt).Round(time.Millisecond),
		lastFail.Sub(promotedAt).Round(time.Millisecond), okAfter, causes(t, in.reg))
	if failed == 0 {
		t.Error("no call failed while the master was dead: the test did not observe the outage")
	}
	if d := lastFail.Sub(promotedAt); d > sentinelBound {
		t.Errorf("failures continued %v after the promotion, want <= %v", d, sentinelBound)
	}
	if okAfter < 100 {
		t.Errorf("only %d normal answers after the last failure", okAfter)
	}
}
