package redise2e

import (
	"math"
	"sync"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// hugeConfig has one 10-per-hour limit per algorithm, failure_mode left
// at its default (open): a cost the store could not decide would be
// admitted.
const hugeConfig = `
domain: huge
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
  - key: concurrency
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: concurrency}
`

var hugeAlgorithms = []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "concurrency"}

// hugeCosts are descriptor hits_addend values beyond every limit: 2^53
// (algo.MaxCost), the first integer a double cannot hold, 2^63-1 and
// 2^64-1.
var hugeCosts = []uint64{1 << 53, 1<<53 + 1, math.MaxInt64, math.MaxUint64}

// TestHugeHitsAddend: a descriptor hits_addend of 2^53 or more is
// OVER_LIMIT on the memory store and on Redis alike, for every algorithm:
// never admitted (by a failure mode or otherwise), the counter keeps what
// it had, a neighbour descriptor of the same request consumes nothing,
// and requests decided concurrently with huge ones (batched into the same
// script invocations on Redis) are decided exactly. No backend error is
// counted.
func TestHugeHitsAddend(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	set := loadSet(t, hugeConfig)

	memSvc, memReg := newService(t, service.Options{Store: newMemory(t)}, set)
	redisIn := newInstance(t, generous(standaloneOpts(srv.URL())), set)
	warm(t, []*instance{redisIn})
	backends := []struct {
		name string
		in   *instance
	}{{"memory", &instance{svc: memSvc, reg: memReg}}, {"redis", redisIn}}

	for _, b := range backends {
		for _, alg := range hugeAlgorithms {
			t.Run(b.name+"/"+alg, func(t *testing.T) {
				awayFromHourBoundary(t)
				in := b.in
				u, n, v := []string{alg, "u"}, []string{alg, "n"}, []string{alg, "v"}
				remaining := func(kv []string) uint32 {
					t.Helper()
					r := req("huge", kv)
					r.Descriptors[0].HitsAddend = wrapperspb.UInt64(0) // check only
					return call(t, in, r).GetStatuses()[0].GetLimitRemaining()
				}
				if r := call(t, in, req("huge", u)); !isOK(r) || r.GetStatuses()[0].GetLimitRemaining() != 9 {
					t.Fatalf("first call: %v, want OK with 9 remaining", r)
				}
				for _, c := range hugeCosts {
					r := req("huge", u, n)
					r.Descriptors[0].HitsAddend = wrapperspb.UInt64(c)
					resp := call(t, in, r)
					st := resp.GetStatuses()
					if isOK(resp) || st[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st[0].GetLimitRemaining() != 9 {
						t.Errorf("hits_addend %d: %v, want OVER_LIMIT with 9 remaining", c, resp)
					}
					if st[1].GetCode() != rlsv3.RateLimitResponse_OK || st[1].GetLimitRemaining() != 10 {
						t.Errorf("hits_addend %d: neighbour %v, want OK with 10 remaining (nothing consumed)", c, st[1])
					}
				}
				// Huge requests on u and cost-1 requests on v at once: the
				// v requests are decided exactly (10 of 25), every huge one
				// is denied.
				var mu sync.Mutex
				var wg sync.WaitGroup
				okV, okU := 0, 0
				start := make(chan struct{})
				for i := range 50 {
					wg.Go(func() {
						<-start
						r := req("huge", v)
						if i%2 == 0 {
							r = req("huge", u)
							r.Descriptors[0].HitsAddend = wrapperspb.UInt64(hugeCosts[i/2%len(hugeCosts)])
						}
						resp := call(t, in, r)
						mu.Lock()
						defer mu.Unlock()
						if isOK(resp) {
							if i%2 == 0 {
								okU++
							} else {
								okV++
							}
						}
					})
				}
				close(start)
				wg.Wait()
				if okU != 0 || okV != 10 {
					t.Errorf("25 huge and 25 cost-1 calls at once: %d huge OK, want 0; %d cost-1 OK of 25 on 10/hour, want 10", okU, okV)
				}
				if got := remaining(u); got != 9 {
					t.Errorf("after the huge calls: %d remaining, want 9 (unchanged)", got)
				}
				if got := remaining(v); got != 0 {
					t.Errorf("v: %d remaining, want 0", got)
				}
				if got := remaining(n); got != 10 {
					t.Errorf("neighbour: %d remaining, want 10", got)
				}
				if c := causes(t, in.reg); len(c) > 0 {
					t.Errorf("backend errors %v", c)
				}
			})
		}
	}
}
