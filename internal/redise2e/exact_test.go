package redise2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// exactConfig has one 30-per-window limit per algorithm. Why these windows
// cannot split the test (which runs on the real clock, as it uses Redis'
// TIME): the windowed algorithms use a 1-hour window and the test waits,
// before it starts, until at least 20 s remain in the current hour
// (awayFromHourBoundary), while the 60 calls take well under a second; the
// token bucket refills 30 per hour (one token per 120 s) from a full bucket
// of 30, so no token can be added while the test runs.
const exactConfig = `
domain: exact
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 30}
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 30, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: hour, requests_per_unit: 30, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 30, algorithm: token_bucket, burst: 30}
`

var exactAlgorithms = []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket"}

// awayFromHourBoundary waits until at least 20 s remain in the current
// hour (at most 20 s).
func awayFromHourBoundary(t testing.TB) {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 20*time.Second {
		t.Logf("waiting %v for the next hour", left)
		time.Sleep(left + 100*time.Millisecond)
	}
}

// concurrentCalls sends n calls of r at once (after a shared start signal),
// call i to instance i%len(ins), and counts OK and OVER_LIMIT answers.
func concurrentCalls(t *testing.T, ins []*instance, n int, r func(i int) *rlsv3.RateLimitRequest) (ok, over int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := ins[i%len(ins)].svc.ShouldRateLimit(ctx, r(i))
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch resp.GetOverallCode() {
			case rlsv3.RateLimitResponse_OK:
				ok++
			case rlsv3.RateLimitResponse_OVER_LIMIT:
				over++
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("ShouldRateLimit: %v", err)
	}
	return ok, over
}

// noBackendErrors fails t when any instance counted a backend error or a
// failed refund (a CROSSSLOT error would be one).
func noBackendErrors(t *testing.T, ins []*instance) {
	t.Helper()
	for i, in := range ins {
		if c := causes(t, in.reg); len(c) > 0 {
			t.Errorf("instance %d: backend errors %v", i, c)
		}
		if n := in.store.RefundErrors(); n != 0 {
			t.Errorf("instance %d: %d refund errors", i, n)
		}
	}
}

// checkExact runs, per algorithm, 60 concurrent calls on one 30-per-window
// key spread over the three instances and wants exactly 30 OK.
func checkExact(t *testing.T, ins []*instance) {
	warm(t, ins)
	for _, alg := range exactAlgorithms {
		t.Run(alg, func(t *testing.T) {
			awayFromHourBoundary(t)
			value := fmt.Sprintf("%s-%d", alg, time.Now().UnixNano())
			ok, over := concurrentCalls(t, ins, 60, func(int) *rlsv3.RateLimitRequest {
				return req("exact", []string{alg, value})
			})
			if ok != 30 || over != 30 {
				t.Errorf("60 concurrent calls on a 30/hour %s key over 3 instances: %d OK, %d OVER_LIMIT; want exactly 30 and 30", alg, ok, over)
			}
			// Afterwards every instance sees the key exhausted.
			for i, in := range ins {
				if r := call(t, in, req("exact", []string{alg, value})); isOK(r) {
					t.Errorf("instance %d: call 61 allowed", i)
				}
			}
		})
	}
	noBackendErrors(t, ins)
}

// TestThreeInstancesShareStandalone: three service instances, each with
// its own redis.Store (own client and pool), share one redis-server.
func TestThreeInstancesShareStandalone(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	set := loadSet(t, exactConfig)
	ins := make([]*instance, 3)
	for i := range ins {
		ins[i] = newInstance(t, generous(standaloneOpts(srv.URL())), set)
	}
	checkExact(t, ins)
}

// clusterOpts are DefaultOptions for the cluster's seed nodes.
func clusterOpts(g *redistest.ClusterGroup) redis.Options {
	o := redis.DefaultOptions()
	o.URL = ""
	o.Mode = redis.Cluster
	o.Addrs = g.Addrs()
	return o
}

// crossConfig has two descriptors whose keys the test places in slots of
// different cluster nodes.
const crossConfig = `
domain: cross
descriptors:
  - key: small
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: small_tb
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket}
  - key: big_log
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_log}
`

// TestClusterExactAndCrossSlot runs the three-instance exactness on a
// 3-master Redis Cluster, then requests whose two descriptors' keys live
// on different nodes: all-or-nothing holds (a denial leaves the other
// counter unchanged, by the compensating refund), no CROSSSLOT error, no
// allowance because of one.
func TestClusterExactAndCrossSlot(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	ctl := g.Client()
	ctx := context.Background()

	t.Run("exact", func(t *testing.T) {
		set := loadSet(t, exactConfig)
		ins := make([]*instance, 3)
		for i := range ins {
			ins[i] = newInstance(t, generous(clusterOpts(g)), set)
		}
		checkExact(t, ins)
	})

	set := loadSet(t, crossConfig)
	ins := make([]*instance, 3)
	for i := range ins {
		ins[i] = newInstance(t, generous(clusterOpts(g)), set)
	}
	// keyOf is the backend key of a one-entry descriptor.
	keyOf := func(k, v string) string {
		m, ok := set.Match("cross", toEntries(k, v))
		if !ok {
			t.Fatalf("no rule for %s=%s", k, v)
		}
		return set.Key(m, 0)
	}
	slot := func(key string) int64 {
		n, err := ctl.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if uint16(n) != redis.Slot(key) {
			t.Fatalf("CLUSTER KEYSLOT %d, redis.Slot %d", n, redis.Slot(key))
		}
		return n
	}
	// node returns the address serving slot s.
	slots, err := ctl.ClusterSlots(ctx).Result() //nolint:staticcheck // CLUSTER SLOTS is still served by Redis 7 and maps slots to nodes directly
	if err != nil {
		t.Fatal(err)
	}
	node := func(s int64) string {
		for _, r := range slots {
			if int64(r.Start) <= s && s <= int64(r.End) {
				return r.Nodes[0].Addr
			}
		}
		t.Fatalf("slot %d unassigned", s)
		return ""
	}
	// pick finds values for (k1, k2) whose keys are on different nodes.
	pick := func(k1, k2 string) (v1, v2, key1, key2 string) {
		base := time.Now().UnixNano()
		for i := range 100 {
			v1, v2 = fmt.Sprintf("a%d-%d", base, i), fmt.Sprintf("b%d-%d", base, i)
			key1, key2 = keyOf(k1, v1), keyOf(k2, v2)
			s1, s2 := slot(key1), slot(key2)
			if s1 != s2 && node(s1) != node(s2) {
				t.Logf("%s=%s key slot %d on %s; %s=%s key slot %d on %s", k1, v1, s1, node(s1), k2, v2, s2, node(s2))
				return
			}
		}
		t.Fatal("no values on different nodes in 100 tries")
		return
	}
	raw := func(key string) string {
		typ, err := ctl.Type(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case "string":
			return ctl.Get(ctx, key).Val()
		case "zset":
			return strings.Join(ctl.ZRange(ctx, key, 0, -1).Val(), ",")
		case "none":
			return "<none>"
		}
		t.Fatalf("key type %s", typ)
		return ""
	}

	for _, tc := range []struct{ small, big string }{
		{"small", "big"},        // fixed windows
		{"small_tb", "big_log"}, // token bucket denies, sliding log refunded
	} {
		t.Run("sequential/"+tc.small+"+"+tc.big, func(t *testing.T) {
			awayFromHourBoundary(t)
			sv, bv, _, bk := pick(tc.small, tc.big)
			both := req("cross", []string{tc.small, sv}, []string{tc.big, bv})
			for i := range 3 {
				if r := call(t, ins[i%3], both); !isOK(r) {
					t.Fatalf("call %d denied: %v", i+1, r)
				}
			}
			before := raw(bk)
			for i := range 5 {
				r := call(t, ins[i%3], both)
				if isOK(r) {
					t.Fatalf("call %d allowed past the small limit", i+4)
				}
				if r.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
					r.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK {
					t.Errorf("statuses %v, want OVER_LIMIT, OK", r.GetStatuses())
				}
				if got := r.GetStatuses()[1].GetLimitRemaining(); got != 997 {
					t.Errorf("big remaining in a denied request %d, want 997 (value before)", got)
				}
			}
			if after := raw(bk); after != before {
				t.Errorf("big counter changed by denied requests: %q -> %q", before, after)
			}
			// The big key alone still has 997 left: nothing consumed by
			// the 5 denied requests.
			r := call(t, ins[0], req("cross", []string{tc.big, bv}))
			if got := r.GetStatuses()[0].GetLimitRemaining(); !isOK(r) || got != 996 {
				t.Errorf("big alone: %v remaining %d, want OK 996", r.GetOverallCode(), got)
			}
		})
	}

	t.Run("concurrent", func(t *testing.T) {
		awayFromHourBoundary(t)
		// 40 concurrent requests, each with the same small (3/hour) and big
		// (1000/hour) keys on different nodes: exactly 3 OK, and the big
		// counter afterwards counts exactly those 3 (37 refunds).
		sv, bv, _, _ := pick("small", "big")
		ok, over := concurrentCalls(t, ins, 40, func(int) *rlsv3.RateLimitRequest {
			return req("cross", []string{"small", sv}, []string{"big", bv})
		})
		if ok != 3 || over != 37 {
			t.Errorf("40 concurrent cross-slot requests: %d OK, %d OVER_LIMIT; want 3 and 37", ok, over)
		}
		r := call(t, ins[1], req("cross", []string{"big", bv}))
		if got := r.GetStatuses()[0].GetLimitRemaining(); got != 1000-3-1 {
			t.Errorf("big remaining after 3 allowed requests and its own: %d, want %d", got, 1000-3-1)
		}
		// The reverse direction: the descriptor listed first allows and is
		// refunded because the second (an exhausted token bucket on
		// another node) denies.
		s1, s2, _, _ := pick("small", "small_tb")
		for range 3 {
			call(t, ins[0], req("cross", []string{"small_tb", s2}))
		}
		ok, over = concurrentCalls(t, ins, 20, func(int) *rlsv3.RateLimitRequest {
			return req("cross", []string{"small", s1}, []string{"small_tb", s2})
		})
		if ok != 0 || over != 20 {
			t.Errorf("20 requests with an exhausted token bucket: %d OK; want 0", ok)
		}
		r = call(t, ins[2], req("cross", []string{"small", s1}))
		if got := r.GetStatuses()[0].GetLimitRemaining(); !isOK(r) || got != 2 {
			t.Errorf("small after 20 denied requests: %v remaining %d, want OK 2 (nothing kept)", r.GetOverallCode(), got)
		}
	})
	noBackendErrors(t, ins)
}
