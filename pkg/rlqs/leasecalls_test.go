package rlqs

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// heldLeases passes Lease to a real store; while hold is set, each call
// waits for gate to close first. It counts the calls in flight, their
// maximum and the calls the store answered, and fails the calls on key
// fail.
type heldLeases struct {
	LeaseStore
	hold                          atomic.Bool
	gate                          chan struct{}
	fail                          string
	calls, inFlight, top, granted atomic.Int64
}

var errHeldLease = errors.New("lease refused by the test")

func (h *heldLeases) Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	h.calls.Add(1)
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	for {
		top := h.top.Load()
		if n <= top || h.top.CompareAndSwap(top, n) {
			break
		}
	}
	if h.hold.Load() {
		select {
		case <-h.gate:
		case <-ctx.Done():
			return algo.LeaseGrant{}, ctx.Err()
		}
	}
	if req.Key == h.fail {
		return algo.LeaseGrant{}, errHeldLease
	}
	g, err := h.LeaseStore.Lease(ctx, req)
	if err == nil {
		h.granted.Add(1)
	}
	return g, err
}

// TestRoundLeasesOverlap: a round of 100 leased counters on a real Redis
// store has maxLeaseCalls lease calls in flight at once, never more, so a
// slow store costs the round about one call's latency, not 100 of them.
// A lease that fails on one counter fails that counter only: the store
// answers the other 99.
func TestRoundLeasesOverlap(t *testing.T) {
	leases := &heldLeases{gate: make(chan struct{})}
	s, keys := leasedRig(t, leases, 30*time.Second)
	const tenants = 100
	leases.fail = keys[0]
	leases.calls.Store(0)
	leases.top.Store(0)
	leases.granted.Store(0)
	leases.hold.Store(true)
	done := make(chan struct{})
	go func() {
		s.Round(context.Background())
		close(done)
	}()
	// The round's calls all wait on the gate: as many as the bound allows
	// are in flight before any returns.
	waitFor(t, "lease calls in flight", func() bool { return leases.inFlight.Load() == maxLeaseCalls })
	close(leases.gate)
	<-done
	if top := leases.top.Load(); top != maxLeaseCalls {
		t.Errorf("at most %d lease calls in flight, want %d", top, maxLeaseCalls)
	}
	if n := leases.calls.Load(); n != tenants {
		t.Errorf("%d lease calls in the round, want %d (one per counter)", n, tenants)
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("reserve")); n != 1 {
		t.Errorf("ratelimitd_rlqs_store_errors_total{op=\"reserve\"} = %v, want 1 (the failed counter's)", n)
	}
	if n := leases.granted.Load(); n != tenants-1 {
		t.Errorf("the store answered %d lease calls, want %d (all but the failed counter's)", n, tenants-1)
	}
}

// leasedRig is a server on a real Redis store whose leases go through
// leases, with one stream reporting a bucket on each of 100 counters;
// the joins are done. It returns the leased counters.
func leasedRig(t *testing.T, leases *heldLeases, roundTimeout time.Duration) (*Server, []string) {
	t.Helper()
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	store, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	leases.LeaseStore = store
	s, err := New(Options{Store: store, Demand: store, Leases: leases, Registerer: prometheus.NewRegistry(), Replica: "a",
		joinTimeout: 30 * time.Second, roundTimeout: roundTimeout})
	if err != nil {
		t.Fatal(err)
	}
	s.SetPolicy(loadSet(t, manyTenantsConfig))
	t.Cleanup(s.Shutdown)

	const tenants = 100
	ms := &memStream{in: make(chan *rlqspb.RateLimitQuotaUsageReports)}
	ms.ctx, ms.cancel = context.WithCancel(context.Background())
	t.Cleanup(ms.cancel)
	ms.envoy = &simEnvoy{t: t, clock: &fakeClock{t: time.Now()}}
	go func() { _ = s.StreamRateLimitQuotas(ms) }()
	var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range tenants {
		us = append(us, usage(map[string]string{"api": "x", "tenant": fmt.Sprint("t", i)}, 0, 2, 0))
	}
	ms.in <- &rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: us}
	waitFor(t, "report processed", func() bool { return s.reported.Load() == 1 })

	s.mu.Lock()
	var keys []string
	for k, ks := range s.keys {
		if s.leased(ks) {
			keys = append(keys, k)
		}
	}
	s.mu.Unlock()
	if len(keys) != tenants {
		t.Fatalf("%d leased counters, want %d", len(keys), tenants)
	}
	return s, keys
}

// TestRoundLeasesStalled: when every lease call of a round stalls, the
// round ends at its budget: each of the 100 counters' leases is counted
// as failed (made and cut off, or not made for want of time), and none
// is granted.
func TestRoundLeasesStalled(t *testing.T) {
	leases := &heldLeases{gate: make(chan struct{})}
	s, _ := leasedRig(t, leases, 300*time.Millisecond)
	leases.calls.Store(0)
	leases.granted.Store(0)
	leases.hold.Store(true)
	done := make(chan struct{})
	go func() {
		s.Round(context.Background())
		close(done)
	}()
	waitFor(t, "the round's end at its budget", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("reserve")); n != 100 {
		t.Errorf("ratelimitd_rlqs_store_errors_total{op=\"reserve\"} = %v, want 100", n)
	}
	if n := leases.granted.Load(); n != 0 {
		t.Errorf("%d leases answered by a stalled store, want 0", n)
	}
	close(leases.gate)
}
