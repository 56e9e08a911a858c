package service_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/lease"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

const leasedConfig = `domain: l
descriptors:
  - key: lz
    rate_limit: {unit: minute, requests_per_unit: 5, consistency: leased}
  - key: ex
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: lz2
    rate_limit: {unit: minute, requests_per_unit: 1, consistency: leased}
  - key: ex2
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 5, consistency: leased, failure_mode: closed}
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 5, consistency: leased}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 1000, consistency: leased}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 1000, consistency: leased}
`

// failingLeases is a memory store whose Lease fails while down is set,
// and does not answer (it waits for its context to end, as a call to a
// frozen server does, or for thaw to close) while stalled is set.
type failingLeases struct {
	*memory.Store
	down, stalled atomic.Bool
	thaw          chan struct{}
	// refundStalled makes Take of released hits (refunds) wait like a
	// stalled Lease.
	refundStalled atomic.Bool
}

func (f *failingLeases) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	if f.refundStalled.Load() && len(hits) > 0 && hits[0].Release {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.thaw:
		}
	}
	return f.Store.Take(ctx, hits, out)
}

func (f *failingLeases) Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	if f.down.Load() {
		return algo.LeaseGrant{}, causeErr{"refused"}
	}
	if f.stalled.Load() {
		select {
		case <-ctx.Done():
			return algo.LeaseGrant{}, ctx.Err()
		case <-f.thaw:
		}
	}
	return f.Store.Lease(ctx, req)
}

// newLeased is a service deciding leased limits from a Leaser on a memory
// store (which also decides the exact ones), on the test clock, a minute
// after the store began. The Leaser's renewal loop ticks only when the
// test sends on the clock's renewals, so no renewal runs on the real
// clock while the test clock stands still.
func newLeased(t *testing.T) (*service.Service, *failingLeases, *clock) {
	return newLeasedAfter(t, time.Minute)
}

// newLeasedAfter is newLeased with the clock after past the store's start.
func newLeasedAfter(t *testing.T, after time.Duration) (*service.Service, *failingLeases, *clock) {
	t.Helper()
	svc, st, c, _ := newLeasedMetered(t, after)
	return svc, st, c
}

// newLeasedMetered is newLeasedAfter with the service's metrics registry.
func newLeasedMetered(t *testing.T, after time.Duration) (*service.Service, *failingLeases, *clock, *prometheus.Registry) {
	t.Helper()
	c := &clock{now: t0}
	m, err := memory.New(memory.Options{Now: c.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	st := &failingLeases{Store: m, thaw: make(chan struct{})}
	c.Advance(after)
	ls, err := lease.New(lease.Options{Store: st, Now: c.Now, Ticker: c.renewTicker, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ls.Close(context.Background()) })
	reg := prometheus.NewRegistry()
	svc := newService(t, testOptions(c, st, reg), func(o *service.Options) { o.Leases = ls })
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "l.yaml"), leasedConfig)
	svc.SetPolicy(loadSet(t, dir))
	return svc, st, c, reg
}

// renewTicker is the Leaser's Options.Ticker on c: its ticks are the
// sends on c.renewals.
func (c *clock) renewTicker(time.Duration) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.renewals == nil {
		c.renewals = make(chan time.Time)
	}
	return c.renewals, func() {}
}

func leasedCodes(t *testing.T, svc *service.Service, n int, ds ...string) []rlsv3.RateLimitResponse_Code {
	t.Helper()
	var out []rlsv3.RateLimitResponse_Code
	for range n {
		var descs = req("l")
		for _, k := range ds {
			descs.Descriptors = append(descs.Descriptors, d(k, "v"))
		}
		resp, err := svc.ShouldRateLimit(context.Background(), descs)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, resp.GetOverallCode())
	}
	return out
}

const (
	okC   = rlsv3.RateLimitResponse_OK
	overC = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestLeasedLimit(t *testing.T) {
	svc, _, _ := newLeased(t)
	got := leasedCodes(t, svc, 7, "lz")
	want := []rlsv3.RateLimitResponse_Code{okC, okC, okC, okC, okC, overC, overC}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("7 calls on 5/minute leased: %v, want %v", got, want)
		}
	}
}

// A fresh memory store admits a leased limit's first hits in the window
// it began in, an hour or a day long: no lease from before it exists.
func TestLeasedFreshMemoryStore(t *testing.T) {
	svc, _, _ := newLeasedAfter(t, 0)
	for _, k := range []string{"hour", "day", "lz"} {
		if got := leasedCodes(t, svc, 3, k); !equalCodes(got, []rlsv3.RateLimitResponse_Code{okC, okC, okC}) {
			t.Errorf("first 3 hits of %s on a fresh store: %v, want OK", k, got)
		}
	}
}

// A request an exact limit denies gives its leased units back; one a
// leased limit denies has its exact hits refunded.
func TestLeasedAllOrNothing(t *testing.T) {
	svc, _, _ := newLeased(t)
	if got := leasedCodes(t, svc, 2, "ex", "lz"); got[0] != okC || got[1] != overC {
		t.Fatalf("ex 1/minute + lz: %v, want OK then OVER_LIMIT", got)
	}
	// lz used 1 (the second request's unit went back): 4 more.
	got := leasedCodes(t, svc, 5, "lz")
	if want := []rlsv3.RateLimitResponse_Code{okC, okC, okC, okC, overC}; !equalCodes(got, want) {
		t.Fatalf("lz after a request ex denied: %v, want %v", got, want)
	}
	if got := leasedCodes(t, svc, 2, "ex2", "lz2"); got[0] != okC || got[1] != overC {
		t.Fatalf("ex2 2/minute + lz2 1/minute: %v, want OK then OVER_LIMIT", got)
	}
	// ex2 used 1 (the second request's unit was refunded): 1 more.
	if got := leasedCodes(t, svc, 2, "ex2"); got[0] != okC || got[1] != overC {
		t.Fatalf("ex2 after a request lz2 denied: %v, want OK then OVER_LIMIT", got)
	}
}

// With the store down, the units in hand are used, then failure_mode
// applies: closed denies, open admits.
func TestLeasedStoreDown(t *testing.T) {
	svc, st, _ := newLeased(t)
	// One call each takes a lease; then the store goes down.
	leasedCodes(t, svc, 1, "closed")
	leasedCodes(t, svc, 1, "open")
	st.down.Store(true)
	got := leasedCodes(t, svc, 12, "closed")
	n := 0
	for _, c := range got {
		if c == okC {
			n++
		}
	}
	if n > 4 || got[len(got)-1] != overC {
		t.Fatalf("closed with the store down: %v: want at most the 4 units in hand, then OVER_LIMIT", got)
	}
	for _, c := range leasedCodes(t, svc, 12, "open") {
		if c != okC {
			t.Fatalf("open with the store down: %v, want OK", c)
		}
	}
}

// With the store stalled (lease operations get no answer), requests with
// a 50 ms deadline are answered: the units in hand, then failure_mode
// (closed denies with a Retry-After, open admits), never the caller's
// deadline.
func TestLeasedStoreStalled(t *testing.T) {
	svc, st, _, reg := newLeasedMetered(t, time.Minute)
	leasedCodes(t, svc, 1, "closed")
	leasedCodes(t, svc, 1, "open")
	st.stalled.Store(true)
	t.Cleanup(func() { close(st.thaw) }) // the renewals in flight end before the Leaser closes
	call := func(key string) *rlsv3.RateLimitResponse {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		descs := req("l")
		descs.Descriptors = append(descs.Descriptors, d(key, "v"))
		resp, err := svc.ShouldRateLimit(ctx, descs)
		if err != nil {
			t.Fatalf("%s with the store stalled: %v, want failure_mode's answer", key, err)
		}
		return resp
	}
	ok := 0
	var last *rlsv3.RateLimitResponse
	for range 12 {
		if last = call("closed"); last.GetOverallCode() == okC {
			ok++
		}
	}
	if ok > 4 || last.GetOverallCode() != overC {
		t.Fatalf("closed with the store stalled: %d OK of 12, last %v: want at most the 4 units in hand, then OVER_LIMIT", ok, last.GetOverallCode())
	}
	if ra := last.GetStatuses()[0].GetDurationUntilReset(); ra == nil {
		t.Errorf("closed with the store stalled: OVER_LIMIT without a reset time: %v", last)
	}
	for range 12 {
		if c := call("open").GetOverallCode(); c != okC {
			t.Fatalf("open with the store stalled: %v, want OK", c)
		}
	}
	if n := metricValue(t, reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "stalled"}); n < 1 {
		t.Errorf("ratelimitd_backend_errors_total{cause=stalled} = %v with the store stalled, want at least 1", n)
	}
}

func equalCodes(a, b []rlsv3.RateLimitResponse_Code) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLeasedRefundBoundedAndMetered: the refund of the exact hits of a
// request a leased limit denied does not hold the request past its own
// deadline when the store stalls, and its failure is counted.
func TestLeasedRefundBoundedAndMetered(t *testing.T) {
	svc, st, _, reg := newLeasedMetered(t, time.Minute)
	if got := leasedCodes(t, svc, 1, "ex2", "lz2"); got[0] != okC {
		t.Fatalf("ex2 + lz2: %v, want OK", got)
	}
	if got := metricValue(t, reg, "ratelimitd_leased_refunds_total", map[string]string{"result": "ok"}); got != 0 {
		t.Fatalf("refunds ok = %v before any denial, want 0", got)
	}
	// lz2 (1/minute) denies the second request: ex2's unit is refunded.
	if got := leasedCodes(t, svc, 1, "ex2", "lz2"); got[0] != overC {
		t.Fatalf("ex2 + lz2 again: %v, want OVER_LIMIT", got)
	}
	if got := metricValue(t, reg, "ratelimitd_leased_refunds_total", map[string]string{"result": "ok"}); got != 1 {
		t.Fatalf("refunds ok = %v, want 1", got)
	}
	st.refundStalled.Store(true)
	t.Cleanup(func() { close(st.thaw) })
	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		descs := req("l")
		descs.Descriptors = append(descs.Descriptors, d("ex2", "v"), d("lz2", "v"))
		resp, err := svc.ShouldRateLimit(ctx, descs)
		if err == nil && resp.GetOverallCode() != overC {
			err = fmt.Errorf("code %v, want OVER_LIMIT", resp.GetOverallCode())
		}
		answered <- err
	}()
	// The refund stalls until thaw closes (at the end of the test); the
	// request must be answered before that.
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("with the refund stalled: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request waited for a stalled refund past its deadline")
	}
	// The detached refund ends at its own deadline and is counted.
	deadline := time.Now().Add(30 * time.Second)
	for metricValue(t, reg, "ratelimitd_leased_refunds_total", map[string]string{"result": "error"}) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the stalled refund was not counted as an error")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
