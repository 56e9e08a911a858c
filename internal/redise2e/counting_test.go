package redise2e

import (
	"context"
	"net"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// countingConfig: 100 per window on every algorithm (one window per
// minute for the refund case of a 100/minute key, an hour otherwise, so
// that no window ends while a test runs: see awayFromBoundary), a
// two-descriptor pair (a 5, b 1 per hour) without counting:, the same
// pair with counting: always_charge, and a post-paid token limit with
// counting: always_charge next to one without.
const countingConfig = `
domain: counting
descriptors:
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket, burst: 100}
  - key: concurrency
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: concurrency}
  - key: small
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: charged_a
    counting: always_charge
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: charged_b
    counting: always_charge
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: post_paid_tokens
    counting: always_charge
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// countingAlgorithms are the keys of countingConfig with 100 per hour.
var countingAlgorithms = []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "concurrency"}

// awayFromBoundary waits until at least 10 s remain in the current minute
// and 20 s in the current hour (at most 30 s): the calls of a test take
// well under a second, so no window of countingConfig ends during one.
// The token bucket refills one token per 36 s from a full bucket, so no
// token is added while a test runs either.
func awayFromBoundary(t testing.TB) {
	t.Helper()
	awayFromHourBoundary(t)
	now := time.Now()
	if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < 10*time.Second {
		t.Logf("waiting %v for the next minute", left)
		time.Sleep(left + 100*time.Millisecond)
	}
}

// backend is a store under test: the memory store or a Redis store on a
// real redis-server (localCache: --local-cache-size).
type backend struct {
	name     string
	newStore func(t testing.TB, localCache int) service.Store
}

// countingBackends returns the memory store and a Redis store on one
// redis-server started for t.
func countingBackends(t *testing.T) []backend {
	t.Helper()
	redistest.Require(t)
	srv := redistest.Standalone(t)
	return []backend{
		{"memory", func(t testing.TB, _ int) service.Store {
			return newMemory(t)
		}},
		{"redis", func(t testing.TB, localCache int) service.Store {
			o := generous(standaloneOpts(srv.URL()))
			o.LocalCacheSize = localCache
			return newStore(t, o)
		}},
	}
}

// grpcService serves a service over store with countingConfig on a real
// gRPC server on a loopback TCP port, as cmd/ratelimitd does, and returns
// a client of it (as Envoy's) and the service's metrics registry.
func grpcService(t testing.TB, store service.Store, counting policy.Counting) (rlsv3.RateLimitServiceClient, *prometheus.Registry) {
	t.Helper()
	svc, reg := newService(t, service.Options{Store: store, Counting: counting}, loadSet(t, countingConfig))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(svc.ServerOption())
	svc.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
	})
	return rlsv3.NewRateLimitServiceClient(conn), reg
}

// desc is a descriptor (key, value) with the descriptor-level hits_addend
// and is_negative_hits Envoy sets (route rate_limit hits_addend; a
// negative addend is sent as is_negative_hits with its magnitude).
func desc(key, value string, hits uint64, negative bool) *rlcommon.RateLimitDescriptor {
	return &rlcommon.RateLimitDescriptor{
		Entries:        []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: value}},
		HitsAddend:     wrapperspb.UInt64(hits),
		IsNegativeHits: negative,
	}
}

// rpc sends one ShouldRateLimit of domain counting over gRPC.
func rpc(t testing.TB, c rlsv3.RateLimitServiceClient, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "counting", Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// expect checks the overall code and each status's code and limit_remaining.
func expect(t testing.TB, what string, r *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, statuses ...any) {
	t.Helper()
	if r.GetOverallCode() != overall {
		t.Errorf("%s: overall %v, want %v", what, r.GetOverallCode(), overall)
	}
	if len(r.GetStatuses())*2 != len(statuses) {
		t.Fatalf("%s: %d statuses, want %d", what, len(r.GetStatuses()), len(statuses)/2)
	}
	for i, s := range r.GetStatuses() {
		code, rem := statuses[2*i].(rlsv3.RateLimitResponse_Code), statuses[2*i+1].(int)
		if s.GetCode() != code || s.GetLimitRemaining() != uint32(rem) {
			t.Errorf("%s: status %d %v remaining %d, want %v remaining %d", what, i, s.GetCode(), s.GetLimitRemaining(), code, rem)
		}
	}
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// TestRefundGRPC: a descriptor with is_negative_hits credits its limit, on
// the memory store and on Redis alike, through gRPC as Envoy sends it: on
// a 100-per-minute key at 90 remaining, a refund of 5 leaves 95 (it used
// to leave 85: the refund was charged). The same on every algorithm (a
// concurrency refund releases leases). A refund is never denied, credits
// at most what was taken, is counted in ratelimitd_refunds_total and
// ratelimitd_refund_units_total, and clears the key's entry in Redis'
// local over-limit cache, so the next request is decided by Redis again.
func TestRefundGRPC(t *testing.T) {
	for _, b := range countingBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			store := b.newStore(t, 100)
			c, reg := grpcService(t, store, policy.CountingDefault)
			awayFromBoundary(t)
			v := "client-" + b.name
			expect(t, "take 10", rpc(t, c, desc("per_minute", v, 10, false)), ok, ok, 90)
			expect(t, "refund 5", rpc(t, c, desc("per_minute", v, 5, true)), ok, ok, 95)
			expect(t, "check", rpc(t, c, desc("per_minute", v, 0, false)), ok, ok, 95)
			expect(t, "refund beyond what was taken", rpc(t, c, desc("per_minute", v, 50, true)), ok, ok, 100)
			expect(t, "take 100", rpc(t, c, desc("per_minute", v, 100, false)), ok, ok, 0)

			for _, alg := range countingAlgorithms {
				expect(t, alg+" take 10", rpc(t, c, desc(alg, v, 10, false)), ok, ok, 90)
				expect(t, alg+" refund 5", rpc(t, c, desc(alg, v, 5, true)), ok, ok, 95)
				expect(t, alg+" check", rpc(t, c, desc(alg, v, 0, false)), ok, ok, 95)
			}
			if got := counter(t, reg, "ratelimitd_refunds_total", map[string]string{"domain": "counting"}); got != 7 {
				t.Errorf("ratelimitd_refunds_total %v, want 7", got)
			}
			if got := counter(t, reg, "ratelimitd_refund_units_total", map[string]string{"domain": "counting"}); got != 80 {
				t.Errorf("ratelimitd_refund_units_total %v, want 80", got)
			}

			// A denial the local over-limit cache holds is dropped by a refund.
			expect(t, "fill small", rpc(t, c, desc("small", v, 10, false)), ok, ok, 0)
			for range 3 {
				expect(t, "small over", rpc(t, c, desc("small", v, 1, false)), over, over, 0)
			}
			if cs, isRedis := store.(interface{ CacheHits() uint64 }); isRedis && cs.CacheHits() == 0 {
				t.Fatal("the local over-limit cache answered none of the denials")
			}
			expect(t, "refund 3", rpc(t, c, desc("small", v, 3, true)), ok, ok, 3)
			expect(t, "small after the refund", rpc(t, c, desc("small", v, 1, false)), ok, ok, 2)
		})
	}
}

// TestPostPaidGRPC: Envoy Gateway's shape for a response cost (cost.response,
// AI Gateway token usage): a request-time descriptor with hits_addend 0
// (a check) and, at stream end (route rate_limit apply_on_stream_done), the
// same descriptor with the cost as hits_addend. With always_charge (the
// rule's counting:, or --counting for rules without one) a cost above
// what remains is charged and the next request-time check is denied: the
// client that spent it is stopped. With all_or_nothing the overshooting
// cost is denied and consumes nothing.
func TestPostPaidGRPC(t *testing.T) {
	for _, b := range countingBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			awayFromBoundary(t)
			v := "tenant-" + b.name
			c, _ := grpcService(t, b.newStore(t, 0), policy.CountingDefault)
			expect(t, "request check", rpc(t, c, desc("post_paid_tokens", v, 0, false)), ok, ok, 100)
			expect(t, "stream end: 60 tokens", rpc(t, c, desc("post_paid_tokens", v, 60, false)), ok, ok, 40)
			expect(t, "request check", rpc(t, c, desc("post_paid_tokens", v, 0, false)), ok, ok, 40)
			// 90 tokens with 40 left: charged, over the limit
			expect(t, "stream end: 90 tokens", rpc(t, c, desc("post_paid_tokens", v, 90, false)), over, over, 0)
			expect(t, "next request check", rpc(t, c, desc("post_paid_tokens", v, 0, false)), over, over, 0)
			// the overshoot stays counted: 150 used, a refund of 60 leaves 90 used
			expect(t, "refund 60", rpc(t, c, desc("post_paid_tokens", v, 60, true)), ok, ok, 10)

			// all_or_nothing: the overshooting cost consumes nothing
			expect(t, "stream end: 60 tokens", rpc(t, c, desc("tokens", v, 60, false)), ok, ok, 40)
			expect(t, "stream end: 90 tokens", rpc(t, c, desc("tokens", v, 90, false)), over, over, 40)
			expect(t, "next request check", rpc(t, c, desc("tokens", v, 0, false)), ok, ok, 40)

			// --counting=always_charge: the rule without counting: charges too
			g, _ := grpcService(t, b.newStore(t, 0), policy.AlwaysCharge)
			w := "global-" + b.name
			expect(t, "stream end: 60 tokens", rpc(t, g, desc("tokens", w, 60, false)), ok, ok, 40)
			expect(t, "stream end: 90 tokens", rpc(t, g, desc("tokens", w, 90, false)), over, over, 0)
			expect(t, "next request check", rpc(t, g, desc("tokens", w, 0, false)), over, over, 0)
		})
	}
}

// TestCountingMultiDescriptorGRPC: a request with two descriptors, a (5
// per hour) and b (1 per hour), sent twice. all_or_nothing: the second is
// denied by b and a consumes nothing (it reports its remaining before the
// request, 4). always_charge, by the rules' counting: or by
// --counting=always_charge: both are charged, a reports 3 (its state after
// its hit) and b OVER_LIMIT, as envoyproxy/ratelimit counts.
func TestCountingMultiDescriptorGRPC(t *testing.T) {
	for _, b := range countingBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			awayFromBoundary(t)
			v := "m-" + b.name
			c, _ := grpcService(t, b.newStore(t, 0), policy.CountingDefault)
			two := func(ka, kb, v string) []*rlcommon.RateLimitDescriptor {
				return []*rlcommon.RateLimitDescriptor{desc(ka, v, 1, false), desc(kb, v, 1, false)}
			}
			expect(t, "all_or_nothing first", rpc(t, c, two("a", "b", v)...), ok, ok, 4, ok, 0)
			expect(t, "all_or_nothing second", rpc(t, c, two("a", "b", v)...), over, ok, 4, over, 0)
			expect(t, "all_or_nothing check", rpc(t, c, desc("a", v, 0, false)), ok, ok, 4)

			expect(t, "always_charge first", rpc(t, c, two("charged_a", "charged_b", v)...), ok, ok, 4, ok, 0)
			expect(t, "always_charge second", rpc(t, c, two("charged_a", "charged_b", v)...), over, ok, 3, over, 0)
			expect(t, "always_charge check", rpc(t, c, desc("charged_a", v, 0, false)), ok, ok, 3)

			g, _ := grpcService(t, b.newStore(t, 0), policy.AlwaysCharge)
			w := "global-" + b.name
			expect(t, "--counting first", rpc(t, g, two("a", "b", w)...), ok, ok, 4, ok, 0)
			expect(t, "--counting second", rpc(t, g, two("a", "b", w)...), over, ok, 3, over, 0)
			expect(t, "--counting check", rpc(t, g, desc("a", w, 0, false)), ok, ok, 3)
		})
	}
}
