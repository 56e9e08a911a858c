package redise2e

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// durableYAML: a fast (Redis) limit, a durable 5-per-day plan, and two
// durable limits with failure modes for the outage test. The fast limits
// count in (365-day) year windows, so that no run spans a window boundary,
// where their exact counts would start again.
const durableYAML = `domain: q
descriptors:
  - key: api
    rate_limit: {unit: year, requests_per_unit: 1000}
  - key: apiclosed
    rate_limit: {unit: year, requests_per_unit: 1000, failure_mode: closed}
  - key: plan
    rate_limit: {unit: day, requests_per_unit: 5, store: durable}
  - key: planclosed
    rate_limit: {unit: day, requests_per_unit: 5, store: durable, failure_mode: closed}
  - key: bigapi
    rate_limit: {unit: year, requests_per_unit: 1000000000}
  - key: bigplan
    rate_limit: {unit: day, requests_per_unit: 1000000000, store: durable}
`

// loadDurable loads durableYAML with a durable store configured, as
// ratelimitd serve --durable-url does.
func loadDurable(t testing.TB) *policy.Set {
	t.Helper()
	set, _, err := policy.LoadSources(policy.LoadOptions{Durable: policy.DurableOptions{Enabled: true, Algorithms: postgres.SupportedAlgorithms()}},
		policy.Source{Name: "durable.yaml", Data: []byte(durableYAML)})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// durableExactTimeout is the durable store's Timeout in these tests (see
// exactTimeout).
const durableExactTimeout = 20 * time.Second

// rlsInstance is one ratelimitd: a Redis store, a PostgreSQL store and a
// service behind a gRPC server on a loopback port.
type rlsInstance struct {
	client rlsv3.RateLimitServiceClient
	reg    *prometheus.Registry
	stop   func()
}

// startRLS starts an instance on the Redis at redisURL and the database
// at pgURL. stop closes its server and stores (a ratelimitd restart).
func startRLS(t *testing.T, redisURL, pgURL string, set *policy.Set) *rlsInstance {
	t.Helper()
	// The Redis store gets the durable store's bound too, as Timeout and
	// MaxWait (which caps every call's budget): a fast call or refund
	// that runs out of budget may have been counted in Redis and is not
	// refunded (a release of a hit that may not have been taken could
	// under-count), so the exact fast count needs Redis to answer every
	// call, which 200 concurrent calls on a loaded host may not do
	// within exactTimeout.
	ro := standaloneOpts(redisURL)
	ro.Timeout, ro.MaxWait = durableExactTimeout, durableExactTimeout
	rs := newStore(t, ro)
	po := postgres.DefaultOptions()
	po.URL = pgURL
	// 200 concurrent decisions on one row wait for its lock one after
	// the other, which can take seconds under the race detector; this
	// test proves exactness, not latency.
	po.Timeout = durableExactTimeout
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ps, err := postgres.New(ctx, po)
	if err != nil {
		t.Fatalf("postgres.New: %v", err)
	}
	svc, reg := newService(t, service.Options{Store: rs, Durable: ps, Fallback: newMemory(t)}, set)
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	go func() { _ = g.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cc.Close()
			g.Stop()
			_ = ps.Close()
			_ = rs.Close()
		})
	}
	t.Cleanup(stop)
	return &rlsInstance{client: rlsv3.NewRateLimitServiceClient(cc), reg: reg, stop: stop}
}

func (r *rlsInstance) code(t *testing.T, rq *rlsv3.RateLimitRequest) (rlsv3.RateLimitResponse_Code, []uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.client.ShouldRateLimit(ctx, rq)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	var rem []uint32
	for _, s := range resp.GetStatuses() {
		rem = append(rem, s.GetLimitRemaining())
	}
	return resp.GetOverallCode(), rem
}

const (
	codeOK   = rlsv3.RateLimitResponse_OK
	codeOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

// TestDurableSurvivesRestartAndFlush: a durable 5-per-day limit, through
// the gRPC service, admits 5 and then denies; it still denies after
// ratelimitd restarts (a new service and stores on the same database) and
// Redis is flushed, while the fast limit's Redis count starts over. 200
// concurrent calls from 3 instances on a fresh key admit exactly 5, each
// of the 195 denied gives its fast hit back, and the fast store keeps the
// 5 admitted hits, plus one per refund that failed, which is metered.
func TestDurableSurvivesRestartAndFlush(t *testing.T) {
	rdb := redistest.Standalone(t)
	pg := pgtest.Start(t)
	pgURL := pg.URL(pg.CreateDB(t))
	set := loadDurable(t)

	first := startRLS(t, rdb.URL(), pgURL, set)
	both := req("q", []string{"api", "k"}, []string{"plan", "acme"})
	for i := range 5 {
		if c, rem := first.code(t, both); c != codeOK || rem[1] != uint32(4-i) {
			t.Fatalf("call %d: %v %v, want OK with %d left", i+1, c, rem, 4-i)
		}
	}
	if c, rem := first.code(t, both); c != codeOver || rem[0] != 995 {
		t.Fatalf("6th call: %v %v, want OVER_LIMIT with the fast limit back at 995", c, rem)
	}
	first.stop()
	if err := rdb.Client().FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}

	second := startRLS(t, rdb.URL(), pgURL, set)
	if c, rem := second.code(t, req("q", []string{"api", "k"})); c != codeOK || rem[0] != 999 {
		t.Fatalf("fast limit after FLUSHALL: %v %v, want OK with 999 left (its count started over)", c, rem)
	}
	if c, _ := second.code(t, both); c != codeOver {
		t.Fatalf("after restart and FLUSHALL: %v, want OVER_LIMIT (the durable count survived)", c)
	}
	if c, _ := second.code(t, req("q", []string{"plan", "acme"})); c != codeOver {
		t.Fatalf("durable only, after restart and FLUSHALL: %v, want OVER_LIMIT", c)
	}

	// 200 concurrent calls from 3 instances on a fresh key.
	insts := []*rlsInstance{second, startRLS(t, rdb.URL(), pgURL, set), startRLS(t, rdb.URL(), pgURL, set)}
	fresh := req("q", []string{"api", "burst"}, []string{"plan", "fresh"})
	const calls = 200
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range calls {
		in := insts[i%len(insts)]
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := in.client.ShouldRateLimit(ctx, fresh)
			if err != nil {
				t.Error(err)
				return
			}
			if resp.GetOverallCode() == codeOK {
				admitted.Add(1)
			}
		})
	}
	before := refundResults(t, insts...)
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("200 concurrent calls from 3 instances took %v", time.Since(began))
	if n := admitted.Load(); n != 5 {
		t.Fatalf("%d of %d concurrent calls from 3 instances admitted, want exactly 5", n, calls)
	}
	// Each denied request's fast hit was refunded before its answer
	// (refundFast waits for it), except where a refund failed: it may or
	// may not have landed, and it is counted in
	// ratelimitd_durable_refunds_total{result="error"}. So the fast
	// count keeps the 5 admitted hits, plus at most one hit per failed
	// refund, and never less (no hit refunded twice).
	after := refundResults(t, insts...)
	failed, refunds := after["error"]-before["error"], after["ok"]+after["error"]-before["ok"]-before["error"]
	if refunds != calls-5 {
		t.Errorf("%v refunds of the burst, want one per denied request: %d", refunds, calls-5)
	}
	c, rem := insts[1].code(t, req("q", []string{"api", "burst"}))
	want := int64(1000 - 5 - 1)
	if c != codeOK || int64(rem[0]) > want || float64(want-int64(rem[0])) > failed {
		for i, in := range insts {
			t.Logf("instance %d: fast-store errors %v; refunds by result %v", i, causes(t, in.reg), refundResults(t, in))
		}
		t.Fatalf("fast limit after the burst: %v %v, want %d left (5 admitted hits kept, the 195 denied refunded), less at most the %v failed refunds", c, rem, want, failed)
	}
	if failed > 0 {
		t.Logf("%v refunds failed (metered); the fast limit has %d left", failed, rem[0])
	}
}

// refundResults returns ratelimitd_durable_refunds_total by result,
// summed over insts.
func refundResults(t testing.TB, insts ...*rlsInstance) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, in := range insts {
		mfs, err := in.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "ratelimitd_durable_refunds_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "result" {
						out[lp.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return out
}

// TestStoresFailApart: with Redis down, durable limits are still counted
// on PostgreSQL and the fast limits get their failure modes; with
// PostgreSQL down, fast limits are still counted on Redis and the durable
// limits get theirs (closed: denied, the fast hit refunded).
func TestStoresFailApart(t *testing.T) {
	rdb := redistest.Standalone(t)
	pg := pgtest.Start(t)
	pgURL := pg.URL(pg.CreateDB(t))
	in := startRLS(t, rdb.URL(), pgURL, loadDurable(t))

	rdb.Kill()
	plan := req("q", []string{"plan", "solo"})
	for i := range 5 {
		if c, rem := in.code(t, plan); c != codeOK || rem[0] != uint32(4-i) {
			t.Fatalf("Redis down, durable call %d: %v %v, want OK with %d left", i+1, c, rem, 4-i)
		}
	}
	if c, _ := in.code(t, plan); c != codeOver {
		t.Fatalf("Redis down, 6th durable call: %v, want OVER_LIMIT", c)
	}
	if c, _ := in.code(t, req("q", []string{"apiclosed", "k"})); c != codeOver {
		t.Fatalf("Redis down, fast failure_mode closed: %v, want OVER_LIMIT", c)
	}
	rdb.Restart()

	pg.Kill()
	fast := req("q", []string{"api", "k2"})
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Redis answers again once the store has reconnected.
		if c, rem := in.code(t, fast); c == codeOK && rem[0] < 1000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Redis did not count again within 20 s of its restart")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, before := in.code(t, fast)
	if c, rem := in.code(t, req("q", []string{"api", "k2"}, []string{"planclosed", "x"})); c != codeOver || rem[0] != before[0] {
		t.Fatalf("PostgreSQL down, fast + durable closed: %v %v, want OVER_LIMIT with the fast hit refunded (%d left)", c, rem, before[0])
	}
	if c, rem := in.code(t, fast); c != codeOK || rem[0] != before[0]-1 {
		t.Fatalf("PostgreSQL down, fast only: %v %v, want OK, counted (%d left)", c, rem, before[0]-1)
	}
}

// BenchmarkMixedStores measures one decision at c=1 (service in process,
// real redis-server and PostgreSQL on loopback, sharing the machine) with
// a fast limit only, a durable limit only, and both (fast first, then
// durable): what a durable limit adds to a request. Every call is
// admitted (the counter is written); keys cycle over 10,000 values.
func BenchmarkMixedStores(b *testing.B) {
	rdb := redistest.Standalone(b)
	pg := pgtest.Start(b)
	po := postgres.DefaultOptions()
	po.URL = pg.URL(pg.CreateDB(b))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ps, err := postgres.New(ctx, po)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ps.Close() })
	rs := newStore(b, standaloneOpts(rdb.URL()))
	svc, reg := newService(b, service.Options{Store: rs, Durable: ps, Fallback: newMemory(b)}, loadDurable(b))
	for _, c := range []struct {
		name  string
		descs func(v string) [][]string
	}{
		{"fast", func(v string) [][]string { return [][]string{{"bigapi", v}} }},
		{"durable", func(v string) [][]string { return [][]string{{"bigplan", v}} }},
		{"mixed", func(v string) [][]string { return [][]string{{"bigapi", v}, {"bigplan", v}} }},
	} {
		b.Run(c.name, func(b *testing.B) {
			reqs := make([]*rlsv3.RateLimitRequest, benchKeys)
			for i := range reqs {
				reqs[i] = req("q", c.descs("k-"+strconv.Itoa(i))...)
			}
			lat := make(latencies, 0, b.N)
			undecided := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				resp, err := svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
				lat = append(lat, time.Since(t0))
				switch {
				case status.Code(err) == codes.DeadlineExceeded:
					// Over the store's Timeout: counted, failed above
					// 0.1% below.
					undecided++
				case err != nil || resp.GetOverallCode() != codeOK:
					b.Fatalf("%v %v", resp.GetOverallCode(), err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(lat.pct(0.5).Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat.pct(0.99).Microseconds()), "p99-µs")
			b.ReportMetric(float64(undecided), "undecided")
			if undecided > b.N/1000 {
				b.Errorf("%d of %d calls not decided within the stores' Timeout", undecided, b.N)
			}
		})
	}
	b.Logf("backend errors: fast %v", causes(b, reg))
}
