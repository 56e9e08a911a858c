package service_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// durableEnv is a service with a fast store, a durable store and a
// fallback, each a faultStore deciding on the test clock, on the config
// testdata/durable.yaml.
type durableEnv struct {
	svc                     *service.Service
	fast, durable, fallback *faultStore
	reg                     *prometheus.Registry
}

func newDurableEnv(t *testing.T) *durableEnv {
	t.Helper()
	c := &clock{now: t0}
	e := &durableEnv{fast: newStore(t, c), durable: newStore(t, c), fallback: newStore(t, c), reg: prometheus.NewRegistry()}
	opts := testOptions(c, e.fast, e.reg)
	opts.Durable, opts.Fallback = e.durable, e.fallback
	e.svc = newService(t, opts, nil)
	set, _, err := policy.Load(policy.LoadOptions{Durable: policy.DurableOptions{Enabled: true}}, "testdata/durable.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e.svc.SetPolicy(set)
	return e
}

func (e *durableEnv) call(t *testing.T, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := e.svc.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// remaining is the LimitRemaining of each status of r.
func remaining(r *rlsv3.RateLimitResponse) []uint32 {
	var rem []uint32
	for _, s := range r.GetStatuses() {
		rem = append(rem, s.GetLimitRemaining())
	}
	return rem
}

func wantAnswer(t *testing.T, what string, r *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, rem ...uint32) {
	t.Helper()
	got := remaining(r)
	if r.GetOverallCode() != code || len(got) != len(rem) {
		t.Fatalf("%s: %s remaining %v, want %s %v", what, r.GetOverallCode(), got, code, rem)
	}
	for i := range rem {
		if got[i] != rem[i] {
			t.Fatalf("%s: %s remaining %v, want %s %v", what, r.GetOverallCode(), got, code, rem)
		}
	}
}

// A request with a fast and a durable limit is all or nothing across the
// two stores: when the durable limit denies, the fast hit it took is
// refunded, so the denied request consumed nothing; each store sees
// only its own limits.
func TestDurableDenialRefundsFastHits(t *testing.T) {
	e := newDurableEnv(t)
	both := req("q", d("api", "k"), d("plan", "acme"))
	wantAnswer(t, "1st", e.call(t, both), rlsv3.RateLimitResponse_OK, 4, 1)
	wantAnswer(t, "2nd", e.call(t, both), rlsv3.RateLimitResponse_OK, 3, 0)
	// The durable limit denies: the fast limit reports the value before
	// the request (its refund's answer) ...
	wantAnswer(t, "3rd", e.call(t, both), rlsv3.RateLimitResponse_OVER_LIMIT, 3, 0)
	wantAnswer(t, "4th", e.call(t, both), rlsv3.RateLimitResponse_OVER_LIMIT, 3, 0)
	// ... and holds it: two requests consumed 2 of 5.
	wantAnswer(t, "fast only", e.call(t, req("q", d("api", "k"))), rlsv3.RateLimitResponse_OK, 2)
	if v := metricValue(t, e.reg, "ratelimitd_durable_refunds_total", map[string]string{"result": "ok"}); v != 2 {
		t.Errorf("durable_refunds{ok} = %v, want 2", v)
	}
	// One call per request on each store, plus one refund per denial on
	// the fast store.
	if f, d := e.fast.Calls(), e.durable.Calls(); f != 4+2+1 || d != 4 {
		t.Errorf("calls: fast %d durable %d, want 7 and 4", f, d)
	}
}

// deadlineStore records the deadline of each refund (a Take of released
// hits) it passes on to its store.
type deadlineStore struct {
	service.Store
	mu        sync.Mutex
	deadlines []time.Time
}

func (s *deadlineStore) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	if len(hits) > 0 && hits[0].Release {
		dl, _ := ctx.Deadline()
		s.mu.Lock()
		s.deadlines = append(s.deadlines, dl)
		s.mu.Unlock()
	}
	return s.Store.Take(ctx, hits, out)
}

// The refund of a request the durable limit denied may take as long as
// the request's own deadline allows, not only refundTimeout: a store
// slowed by load answers it within the time the request waits for it.
func TestDurableRefundGetsRequestDeadline(t *testing.T) {
	c := &clock{now: t0}
	reg := prometheus.NewRegistry()
	fast := &deadlineStore{Store: newStore(t, c)}
	opts := testOptions(c, fast, reg)
	opts.Durable, opts.Fallback = newStore(t, c), newStore(t, c)
	svc := newService(t, opts, nil)
	set, _, err := policy.Load(policy.LoadOptions{Durable: policy.DurableOptions{Enabled: true}}, "testdata/durable.yaml")
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(set)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	want, _ := ctx.Deadline()
	both := req("q", d("api", "k"), d("plan", "acme"))
	for range 3 { // the plan admits 2
		if _, err := svc.ShouldRateLimit(ctx, both); err != nil {
			t.Fatal(err)
		}
	}
	fast.mu.Lock()
	defer fast.mu.Unlock()
	if len(fast.deadlines) != 1 {
		t.Fatalf("%d refunds, want 1", len(fast.deadlines))
	}
	if got := fast.deadlines[0]; !got.Equal(want) {
		t.Errorf("refund deadline %v, want the request's %v", got, want)
	}
}

// When the fast limits deny, the durable store is asked only to check:
// the durable quota is not spent by a request the fast store refused.
func TestFastDenialSpendsNoDurableQuota(t *testing.T) {
	e := newDurableEnv(t)
	both := req("q", d("one", "k"), d("day3", "acme"))
	wantAnswer(t, "1st", e.call(t, both), rlsv3.RateLimitResponse_OK, 0, 2)
	for i := range 3 {
		wantAnswer(t, "fast denies", e.call(t, both), rlsv3.RateLimitResponse_OVER_LIMIT, 0, 2)
		_ = i
	}
	wantAnswer(t, "durable only", e.call(t, req("q", d("day3", "acme"))), rlsv3.RateLimitResponse_OK, 1)
}

// A durable store failure applies the durable limits' failure modes
// (closed: the request is denied and the fast hit refunded; open:
// admitted, the fast hit kept; local: the fallback decides), counted in
// ratelimitd_durable_errors_total, not in the fast store's error count;
// requests without durable limits do not notice.
func TestDurableFailureModes(t *testing.T) {
	e := newDurableEnv(t)
	e.durable.fail(causeErr{"refused"})
	api := d("api", "k")
	wantAnswer(t, "closed", e.call(t, req("q", api, d("closedq", "a"))), rlsv3.RateLimitResponse_OVER_LIMIT, 5, 0)
	wantAnswer(t, "fast only after closed", e.call(t, req("q", api)), rlsv3.RateLimitResponse_OK, 4)
	wantAnswer(t, "open", e.call(t, req("q", api, d("openq", "a"))), rlsv3.RateLimitResponse_OK, 3, 0)
	wantAnswer(t, "local 1", e.call(t, req("q", api, d("localq", "a"))), rlsv3.RateLimitResponse_OK, 2, 0)
	wantAnswer(t, "local 2", e.call(t, req("q", api, d("localq", "a"))), rlsv3.RateLimitResponse_OVER_LIMIT, 2, 0)
	wantAnswer(t, "fast only", e.call(t, req("q", api)), rlsv3.RateLimitResponse_OK, 1)
	if v := metricValue(t, e.reg, "ratelimitd_durable_errors_total", map[string]string{"cause": "refused"}); v != 4 {
		t.Errorf("durable_errors{refused} = %v, want 4", v)
	}
	if v := metricValue(t, e.reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "refused"}); v != 0 {
		t.Errorf("backend_errors{refused} = %v, want 0: the fast store did not fail", v)
	}
	for _, c := range []struct{ rule, result string }{{"q.closedq", "failed_closed"}, {"q.openq", "failed_open"}, {"q.api", "ok"}} {
		if v := metricValue(t, e.reg, "ratelimitd_decisions_total", map[string]string{"domain": "q", "rule": c.rule, "result": c.result}); v == 0 {
			t.Errorf("decisions{rule=%s,result=%s} = 0", c.rule, c.result)
		}
	}
}

// A fast store failure does not touch the durable limits, and a durable
// store failure does not touch the fast ones.
func TestStoresFailIndependently(t *testing.T) {
	e := newDurableEnv(t)
	e.fast.fail(causeErr{"refused"})
	plan := req("q", d("plan", "acme"))
	wantAnswer(t, "durable 1", e.call(t, plan), rlsv3.RateLimitResponse_OK, 1)
	wantAnswer(t, "durable 2", e.call(t, plan), rlsv3.RateLimitResponse_OK, 0)
	wantAnswer(t, "durable 3", e.call(t, plan), rlsv3.RateLimitResponse_OVER_LIMIT, 0)
	if n := e.fast.Calls(); n != 0 {
		t.Errorf("the fast store was called %d times for durable-only requests", n)
	}
	if v := metricValue(t, e.reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "refused"}); v != 0 {
		t.Errorf("backend_errors{refused} = %v, want 0", v)
	}
	e.fast.fail(nil)
	e.durable.fail(causeErr{"refused"})
	api := req("q", d("api", "k"))
	for i := range 5 {
		wantAnswer(t, "fast", e.call(t, api), rlsv3.RateLimitResponse_OK, uint32(4-i))
	}
	wantAnswer(t, "fast 6th", e.call(t, api), rlsv3.RateLimitResponse_OVER_LIMIT, 0)
	if n := e.durable.Calls(); n != 3 {
		t.Errorf("the durable store was called %d times, want 3 (only for durable limits)", n)
	}
	if v := metricValue(t, e.reg, "ratelimitd_durable_errors_total", map[string]string{"cause": "refused"}); v != 0 {
		t.Errorf("durable_errors{refused} = %v, want 0", v)
	}
}

// Many concurrent mixed requests admit exactly the durable limit, and the
// fast store keeps exactly the admitted requests' hits: every denied
// request's fast hit was refunded.
func TestDurableConcurrentExact(t *testing.T) {
	e := newDurableEnv(t)
	const callers, limit = 400, 50
	var ok atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-start
			r, err := e.svc.ShouldRateLimit(context.Background(), req("q", d("wide", "k"), d("pool", "acme")))
			if err != nil {
				t.Error(err)
				return
			}
			if r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := ok.Load(); n != limit {
		t.Fatalf("%d of %d admitted, want %d", n, callers, limit)
	}
	wantAnswer(t, "fast after", e.call(t, req("q", d("wide", "k"))), rlsv3.RateLimitResponse_OK, 100000-limit-1)
}

// Explain reads each limit from the store that keeps it, and Reset
// deletes each counter there.
func TestDurableExplainAndReset(t *testing.T) {
	e := newDurableEnv(t)
	// Stores that reset: pkg/backend/memory, without the faultStore.
	c := &clock{now: t0}
	opts := testOptions(c, newMemoryStore(t, c).inner, prometheus.NewRegistry())
	opts.Durable = newMemoryStore(t, c).inner
	e.svc = newService(t, opts, nil)
	set, _, err := policy.Load(policy.LoadOptions{Durable: policy.DurableOptions{Enabled: true}}, "testdata/durable.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e.svc.SetPolicy(set)
	both := req("q", d("api", "k"), d("plan", "acme"))
	e.call(t, both)
	ex, err := e.svc.Explain(context.Background(), both)
	if err != nil {
		t.Fatal(err)
	}
	if got := [2]int64{ex.Descriptors[0].Limits[0].Remaining, ex.Descriptors[1].Limits[0].Remaining}; got != [2]int64{4, 1} {
		t.Fatalf("explain remaining %v, want [4 1]", got)
	}
	if _, err := e.svc.Reset(context.Background(), req("q", d("plan", "acme")), "test"); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, "after reset", e.call(t, both), rlsv3.RateLimitResponse_OK, 3, 1)
}

// A fast store that times out at the caller's deadline leaves the request
// undecided (DeadlineExceeded) without charging the durable quota; so does
// a durable store that answers it was not decided within the caller's
// deadline, and it keeps the fast hits (the caller's failure policy may
// admit the request).
func TestUndecidedAcrossStores(t *testing.T) {
	e := newDurableEnv(t)
	both := req("q", d("api", "k"), d("day3", "acme"))
	e.fast.fail(callerDeadlineErr{})
	if _, err := e.svc.ShouldRateLimit(context.Background(), both); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("fast store timed out: %v, want DeadlineExceeded", err)
	}
	if n := e.durable.Calls(); n != 0 {
		t.Fatalf("the durable store was asked %d times for a request the fast store did not decide", n)
	}
	e.fast.fail(nil)
	for _, err := range []error{callerDeadlineErr{}, causeErr{"deadline"}} {
		e.durable.fail(err)
		if _, err := e.svc.ShouldRateLimit(context.Background(), both); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("durable store out of the caller's time: %v, want DeadlineExceeded", err)
		}
	}
	e.durable.fail(nil)
	wantAnswer(t, "after both", e.call(t, both), rlsv3.RateLimitResponse_OK, 2, 2)
}

// A durable store that times out on its own budget (--durable-timeout,
// well within the caller's deadline) or whose circuit is open failed: the
// durable limits' failure modes answer, not DeadlineExceeded, and the
// fast limits are still enforced.
func TestDurableTimeoutGetsFailureModes(t *testing.T) {
	for _, fault := range []error{causeErr{"timeout"}, causeErr{"circuit_open"}} {
		t.Run(fault.Error(), func(t *testing.T) {
			e := newDurableEnv(t)
			e.durable.fail(fault)
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			api := d("api", "k")
			for i := range 5 {
				resp, err := e.svc.ShouldRateLimit(ctx, req("q", api, d("openq", "a")))
				if err != nil {
					t.Fatalf("open, call %d: %v, want failure_mode open", i, err)
				}
				wantAnswer(t, "open", resp, rlsv3.RateLimitResponse_OK, uint32(4-i), 0)
			}
			resp, err := e.svc.ShouldRateLimit(ctx, req("q", api, d("openq", "a")))
			if err != nil {
				t.Fatal(err)
			}
			wantAnswer(t, "open, fast limit spent", resp, rlsv3.RateLimitResponse_OVER_LIMIT, 0, 0)
			resp, err = e.svc.ShouldRateLimit(ctx, req("q", d("closedq", "a")))
			if err != nil {
				t.Fatal(err)
			}
			wantAnswer(t, "closed", resp, rlsv3.RateLimitResponse_OVER_LIMIT, 0)
			for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
				resp, err := e.svc.ShouldRateLimit(ctx, req("q", d("localq", "a")))
				if err != nil || resp.GetOverallCode() != want {
					t.Fatalf("local, call %d: %v %v, want %v", i, resp.GetOverallCode(), err, want)
				}
			}
			if v := metricValue(t, e.reg, "ratelimitd_durable_errors_total", map[string]string{"cause": fault.(causeErr).cause}); v != 9 {
				t.Errorf("durable_errors{%s} = %v, want 9", fault, v)
			}
		})
	}
}
