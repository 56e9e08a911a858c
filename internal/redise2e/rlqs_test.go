package redise2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// rlqsFloodYAML: a per-tenant limit the RLQS buckets match (one counter
// per tenant), and the limit of the other clients' ShouldRateLimit calls,
// failure_mode closed so that a store failure shows in their answers. The
// windows are years, so that no run spans a window boundary.
const rlqsFloodYAML = `domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: year, requests_per_unit: 1000000000}
  - key: api
    value: other
    rate_limit: {unit: year, requests_per_unit: 1000000000, failure_mode: closed}
`

// rlqsServe serves srv on a loopback gRPC listener and returns a client
// connection to it.
func rlqsServe(t *testing.T, srv *rlqs.Server) *grpc.ClientConn {
	t.Helper()
	g := grpc.NewServer(grpc.WaitForHandlers(true))
	srv.Register(g)
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestRLQSFloodSparesOthers: one Envoy stream reports 20,000 buckets every
// interval on the Redis store that ShouldRateLimit uses. The stream's
// buckets past the per-stream bound are answered DENY_ALL and counted, the
// usage of the others is charged in chunks, and meanwhile the other
// clients' ShouldRateLimit calls never see the store fail: the circuit
// breaker stays closed and no call gets an outage cause.
func TestRLQSFloodSparesOthers(t *testing.T) {
	const (
		buckets = 20000
		reports = 4
		bound   = rlqs.DefaultMaxBucketsPerStream
	)
	srv := redistest.Standalone(t)
	// A Timeout no plain call reaches, so that only the flood can fail
	// calls.
	o := standaloneOpts(srv.URL())
	o.Timeout = 250 * time.Millisecond
	st := newStore(t, o)
	warm(t, []*instance{{store: st}})
	set := loadSet(t, rlqsFloodYAML)
	svc, sreg := newService(t, service.Options{Store: st}, set)

	reg := prometheus.NewRegistry()
	q, err := rlqs.New(rlqs.Options{Store: st, Demand: st, Registerer: reg, Replica: "a",
		Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	q.SetPolicy(set)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); q.Run(ctx) }()
	t.Cleanup(func() { cancel(); q.Shutdown(); wg.Wait() })

	cc := rlqsServe(t, q)
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	stream, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(sctx)
	if err != nil {
		t.Fatal(err)
	}
	// What the stream was told, per bucket: the last action.
	var mu sync.Mutex
	last := map[string]string{}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			for _, a := range r.GetBucketAction() {
				last[a.GetBucketId().GetBucket()["tenant"]] = actionOf(a)
			}
			mu.Unlock()
		}
	}()

	// The other clients: ShouldRateLimit in a loop, and the breaker
	// sampled, until the flood ends.
	stop := make(chan struct{})
	var calls, failed, errored, open atomic.Int64
	var latMu sync.Mutex
	var lat latencies
	var others sync.WaitGroup
	for range 4 {
		others.Add(1)
		go func() {
			defer others.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// A budget no call needs: the test is about the store's
				// answers, not scheduling.
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				t0 := time.Now()
				resp, err := svc.ShouldRateLimit(cctx, req("edge", []string{"api", "other"}))
				d := time.Since(t0)
				ccancel()
				latMu.Lock()
				lat = append(lat, d)
				latMu.Unlock()
				calls.Add(1)
				switch {
				case err != nil:
					errored.Add(1)
				case !isOK(resp):
					failed.Add(1)
				}
			}
		}()
	}
	others.Add(1)
	go func() {
		defer others.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				if st.BreakerState() != "closed" {
					open.Add(1)
				}
			}
		}
	}()

	// The flood: every bucket reported with one request allowed, every
	// interval, as Envoy reports all its buckets.
	for i := range reports {
		m := &rlqspb.RateLimitQuotaUsageReports{Domain: "edge"}
		elapsed := time.Second
		if i == 0 {
			elapsed = 0
		}
		for b := range buckets {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:    &rlqspb.BucketId{Bucket: map[string]string{"tenant": "t" + strconv.Itoa(b)}},
				TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: 1})
		}
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
		time.Sleep(rlqs.DefaultInterval)
	}
	// Every report processed (each answered its buckets past the bound),
	// then three more rounds: the last report's usage is charged, or
	// retried until dropped and counted.
	overBound := func() float64 {
		return counter(t, reg, "ratelimitd_rlqs_buckets_over_bound_total", map[string]string{"action": "deny_all"})
	}
	// The waits report and go on, so that the other clients are checked
	// whatever the bound did.
	poll := func(timeout time.Duration, what string, cond func() bool) {
		for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Since(start) > timeout {
				t.Errorf("%s: not within %v", what, timeout)
				return
			}
		}
	}
	poll(time.Minute, "every report processed", func() bool { return overBound() >= reports*(buckets-bound) })
	tokenBuckets := func() float64 {
		return counter(t, reg, "ratelimitd_rlqs_assignments_total", map[string]string{"action": "token_bucket"})
	}
	sent := tokenBuckets()
	poll(time.Minute, "three rounds", func() bool { return tokenBuckets() >= sent+3*bound })
	close(stop)
	others.Wait()
	t.Logf("others: %d calls, %d failed; breaker not closed in %d samples; latency %v", calls.Load(), failed.Load(), open.Load(), lat)
	if calls.Load() == 0 {
		t.Fatal("the other clients made no call")
	}
	// No call saw the store fail: no outage cause, the breaker closed
	// throughout. A call that waited past the store's MaxWait in ratelimitd
	// itself (cause deadline: CPU starvation, not the store) is logged,
	// not failed.
	bad := causes(t, sreg)
	deadline := bad[redis.CauseDeadline]
	delete(bad, redis.CauseDeadline)
	if len(bad) > 0 || open.Load() > 0 || errored.Load() > 0 || failed.Load() > int64(deadline) {
		t.Errorf("the flood hurt the other clients: %d of %d calls failed (%d errors), breaker not closed in %d samples; backend errors %v besides %v deadline",
			failed.Load(), calls.Load(), errored.Load(), open.Load(), bad, deadline)
	}

	// The bound: the first bound buckets of the report are tracked and
	// charged, the others answered DENY_ALL and counted.
	mu.Lock()
	var tracked, denied int
	for b := range buckets {
		switch a := last["t"+strconv.Itoa(b)]; {
		case b < bound && a == "token_bucket":
			tracked++
		case b >= bound && a == "DENY_ALL":
			denied++
		}
	}
	mu.Unlock()
	if tracked != bound || denied != buckets-bound {
		t.Errorf("buckets within the bound with a token bucket: %d, want %d; past it with DENY_ALL: %d, want %d", tracked, bound, denied, buckets-bound)
	}
	over := overBound()
	if want := float64(reports * (buckets - bound)); over != want {
		t.Errorf("ratelimitd_rlqs_buckets_over_bound_total{action=deny_all} = %v, want %v", over, want)
	}
	dropped := counter(t, reg, "ratelimitd_rlqs_usage_dropped_total", map[string]string{"reason": "bucket_bound"})
	if want := float64(reports * (buckets - bound)); dropped != want {
		t.Errorf("ratelimitd_rlqs_usage_dropped_total{reason=bucket_bound} = %v, want %v", dropped, want)
	}
	// Every report of a tracked bucket was charged, in chunks:
	// ShouldRateLimit on the same tenant sees it (remaining after its own
	// hit). A chunk that failed (a starved round can run out of time)
	// is charged at a later round, or dropped and counted; a chunk
	// that timed out after Redis ran it is charged again (over-counted,
	// never under).
	chargeErrs := counter(t, reg, "ratelimitd_rlqs_store_errors_total", map[string]string{"op": "charge"})
	lost := counter(t, reg, "ratelimitd_rlqs_usage_dropped_total", map[string]string{"reason": "store"})
	t.Logf("charge calls failed: %v; usage dropped after failed charges: %v", chargeErrs, lost)
	for _, b := range []int{0, bound - 1} {
		resp := call(t, &instance{svc: svc}, req("edge", []string{"tenant", "t" + strconv.Itoa(b)}))
		charged := int64(1000000000) - int64(resp.GetStatuses()[0].GetLimitRemaining()) - 1
		switch {
		case lost == 0 && charged < reports:
			t.Errorf("tenant t%d: %d charged of %d reported, and no usage counted as dropped", b, charged, reports)
		case chargeErrs == 0 && charged != reports:
			t.Errorf("tenant t%d: %d charged of %d reported, and no charge failed", b, charged, reports)
		}
	}
	scancel()
	<-recvDone
}

// actionOf names a bucket action: token_bucket, ALLOW_ALL, DENY_ALL or
// abandon.
func actionOf(a *rlqspb.RateLimitQuotaResponse_BucketAction) string {
	if a.GetAbandonAction() != nil {
		return "abandon"
	}
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	if s.GetTokenBucket() != nil {
		return "token_bucket"
	}
	if s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL {
		return "DENY_ALL"
	}
	return fmt.Sprint(s.GetBlanketRule())
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// rlqsDurableYAML: a durable per-plan budget, in year windows so that no
// run spans a window boundary.
const rlqsDurableYAML = `domain: q
descriptors:
  - key: plan
    rate_limit: {unit: year, requests_per_unit: 100, store: durable}
`

// TestRLQSDurableSharesCounter: RLQS usage on a `store: durable` limit is
// charged to PostgreSQL, on the counter ShouldRateLimit decides that limit
// on: the usage an Envoy reports takes from what ShouldRateLimit has
// left, and the hits ShouldRateLimit takes make the RLQS budget spent
// (DENY_ALL) at the next round.
func TestRLQSDurableSharesCounter(t *testing.T) {
	pg := pgtest.Start(t)
	po := postgres.DefaultOptions()
	po.URL = pg.URL(pg.CreateDB(t))
	po.Timeout = durableExactTimeout
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ps, err := postgres.New(ctx, po)
	if err != nil {
		t.Fatalf("postgres.New: %v", err)
	}
	t.Cleanup(func() { _ = ps.Close() })
	set, _, err := policy.LoadSources(policy.LoadOptions{Durable: policy.DurableOptions{Enabled: true, Algorithms: postgres.SupportedAlgorithms()}},
		policy.Source{Name: "durable.yaml", Data: []byte(rlqsDurableYAML)})
	if err != nil {
		t.Fatal(err)
	}
	fast := newMemory(t)
	svc, _ := newService(t, service.Options{Store: fast, Durable: ps}, set)
	in := &instance{svc: svc}
	// The rounds are run by the test; a long interval gives each round's
	// store calls a budget no call needs.
	q, err := rlqs.New(rlqs.Options{Store: fast, Durable: ps, Interval: 20 * time.Second, Replica: "a",
		Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	q.SetPolicy(set)
	t.Cleanup(q.Shutdown)
	stream, err := rlqspb.NewRateLimitQuotaServiceClient(rlqsServe(t, q)).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{"plan": "gold"}
	// report sends the bucket's usage with a new marker bucket, and waits
	// for the marker's answer (a new bucket is answered at once): then
	// the usage is recorded.
	markers := 0
	report := func(elapsed time.Duration, allowed uint64) {
		t.Helper()
		markers++
		marker := "marker" + strconv.Itoa(markers)
		if err := stream.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "q", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: &rlqspb.BucketId{Bucket: id}, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed},
			{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"plan": marker}}},
		}}); err != nil {
			t.Fatal(err)
		}
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range r.GetBucketAction() {
				if a.GetBucketId().GetBucket()["plan"] == marker {
					return
				}
			}
		}
	}
	// next returns the action the stream gets for the bucket at the next
	// round.
	next := func() string {
		t.Helper()
		q.Round(context.Background())
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range r.GetBucketAction() {
				if a.GetBucketId().GetBucket()["plan"] == "gold" {
					return actionOf(a)
				}
			}
		}
	}
	remaining := func() uint32 {
		t.Helper()
		return call(t, in, req("q", []string{"plan", "gold"})).GetStatuses()[0].GetLimitRemaining()
	}

	report(0, 1)
	report(time.Second, 59)
	if a := next(); a != "token_bucket" {
		t.Fatalf("after 60 of 100 reported: %s, want token_bucket", a)
	}
	// 60 reported by the Envoy, then one ShouldRateLimit hit.
	if got := remaining(); got != 100-60-1 {
		t.Fatalf("ShouldRateLimit remaining %d after 60 reported over RLQS and its own hit, want %d: RLQS usage is not on the durable counter", got, 100-60-1)
	}
	// ShouldRateLimit takes the rest; the next round reads the durable
	// counter and finds the budget spent.
	for got := remaining(); got > 0; got = remaining() {
	}
	if a := next(); a != "DENY_ALL" {
		t.Errorf("after ShouldRateLimit spent the durable budget: %s, want DENY_ALL", a)
	}
}
