package redise2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// floodRules: one 10-per-hour rule per algorithm, each decided by the
// local fallback while Redis is down.
const floodRules = `
domain: flood
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 10, failure_mode: local}
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window, failure_mode: local}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket, failure_mode: local}
  - key: sliding_log
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_log, failure_mode: local}
  - key: concurrency
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: concurrency, failure_mode: local}
`

// TestLocalFallbackFlood: with Redis down, failure_mode local rules are
// decided by the in-memory fallback, bounded as --memory-max-keys bounds
// it (64 keys here). For each algorithm, 64 unique values fill it, then
// 8 goroutines send 200 more while 30 goroutines each call once with a
// victim value that arrived after the store filled: the victim is
// admitted exactly 10 times on a 10-per-hour rule with the algorithms the
// fallback's sketch decides (fixed window, sliding window, token bucket)
// and never with the others (sliding log, concurrency: denied while no
// slot is free); a full fallback fails open on none of them.
func TestLocalFallbackFlood(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	srv.Kill()
	set := loadSet(t, floodRules)
	for _, c := range []struct {
		rule string
		want int64
	}{
		{"fixed_window", 10}, {"sliding_window", 10}, {"token_bucket", 10}, {"sliding_log", 0}, {"concurrency", 0},
	} {
		t.Run(c.rule, func(t *testing.T) {
			fb, err := memory.New(memory.Options{MaxKeys: 64})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fb.Close() })
			st := newStore(t, standaloneOpts(srv.URL()))
			in := &instance{store: st}
			in.svc, in.reg = newService(t, service.Options{Store: st, Fallback: fb}, set)
			for i := range 64 {
				if r := call(t, in, req("flood", []string{c.rule, fmt.Sprint("fill", i)})); !isOK(r) {
					t.Fatalf("filling value %d: %v", i, r.GetOverallCode())
				}
			}
			if fb.Len() != 64 {
				t.Fatalf("fallback holds %d keys, want 64 (full)", fb.Len())
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for i := range 25 {
						callErr(t, in, req("flood", []string{c.rule, fmt.Sprintf("flood%d:%d", g, i)}))
					}
				}()
			}
			for range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if r := callErr(t, in, req("flood", []string{c.rule, "victim"})); r != nil && isOK(r) {
						admitted.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if got := admitted.Load(); got != c.want {
				t.Errorf("victim admitted %d of 30 by the full local fallback on a 10-per-hour rule, want %d", got, c.want)
			}
			if fb.Len() > 64 {
				t.Errorf("fallback holds %d keys, above its bound 64", fb.Len())
			}
			if n := counter(t, in.reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "fallback"}); n != 0 {
				t.Errorf("ratelimitd_backend_errors_total{cause=\"fallback\"} = %v, want 0: a full fallback fails no call", n)
			}
		})
	}
}

// callErr is call for goroutines other than the test's: an error is
// reported with t.Error and gives nil.
func callErr(t testing.TB, in *instance, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := in.svc.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Error(err)
		return nil
	}
	return resp
}
