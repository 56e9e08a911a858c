package rlqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// sizes records the size of every call on a Store and a Demand.
type sizes struct {
	mu     sync.Mutex
	store  Store
	demand Demand
	takes  []int
	usage  int // hits that charge usage (Cost > 0), not the budget reads
	shares []int
}

func (s *sizes) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	s.mu.Lock()
	s.takes = append(s.takes, len(hits))
	for _, h := range hits {
		if h.Cost > 0 {
			s.usage++
		}
	}
	s.mu.Unlock()
	return s.store.Take(ctx, hits, out)
}

func (s *sizes) ShareDemand(ctx context.Context, round int64, ttl time.Duration, local map[string]map[string]int64) (map[string]map[string]int64, error) {
	s.mu.Lock()
	s.shares = append(s.shares, len(local))
	s.mu.Unlock()
	return s.demand.ShareDemand(ctx, round, ttl, local)
}

// check fails t when a call had more than chargeChunk counters, and
// returns the hits of all Takes that charged usage.
func (s *sizes) check(t *testing.T) (taken int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.takes {
		if n > chargeChunk {
			t.Errorf("a Take of %d hits, want at most %d", n, chargeChunk)
		}
	}
	taken = s.usage
	for _, n := range s.shares {
		if n > chargeChunk {
			t.Errorf("a ShareDemand of %d counters, want at most %d", n, chargeChunk)
		}
	}
	return taken
}

const tenantConfig = `domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

// TestChargeInChunks: a report of 3.5 chunks of buckets is charged and its
// demand shared in calls of at most chargeChunk counters, and every
// bucket's usage reaches its counter.
func TestChargeInChunks(t *testing.T) {
	r := newRig(t, tenantConfig, nil)
	rec := &sizes{store: r.store, demand: NewMemory()}
	r.srv.opt.Store, r.srv.opt.Demand = rec, rec
	c := r.open()
	n := 3*128 + 64 // 3.5 chunks
	var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range n {
		us = append(us, usage(map[string]string{"tenant": "t" + strconv.Itoa(i)}, 0, 3, 0))
	}
	c.send("edge", us...)
	c.recv()
	r.clock.Add(time.Second)
	r.srv.Round(context.Background())
	c.recv()
	if taken := rec.check(t); taken != n {
		t.Errorf("%d hits taken, want %d", taken, n)
	}
	set := r.srv.set.Load()
	for _, i := range []int{0, n - 1} {
		b := &bucket{st: &stream{domain: "edge"}, entries: toEntries("tenant", "t"+strconv.Itoa(i))}
		r.srv.match(b, set)
		out := make([]algo.Decision, 1)
		if err := r.store.Take(context.Background(), []algo.Hit{{Key: b.keys[0], Limit: b.specs[0].Limit}}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Remaining != 1000-3 {
			t.Errorf("tenant t%d: remaining %d, want %d", i, out[0].Remaining, 1000-3)
		}
	}
}

// flakyStore fails every Take while down is set, with err (an outage
// when nil).
type flakyStore struct {
	Store
	mu   sync.Mutex
	down bool
	err  error
}

func (f *flakyStore) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	f.mu.Lock()
	down, err := f.down, f.err
	f.mu.Unlock()
	if down {
		if err == nil {
			err = errors.New("store down")
		}
		return err
	}
	return f.Store.Take(ctx, hits, out)
}

// TestChargeDroppedAfterFailures: usage whose charge fails is offered again
// for maxChargeTries rounds, then dropped and counted, not retried
// forever.
func TestChargeDroppedAfterFailures(t *testing.T) {
	r := newRig(t, tenantConfig, nil)
	f := &flakyStore{Store: r.store, down: true}
	r.srv.opt.Store = f
	c := r.open()
	id := map[string]string{"tenant": "a"}
	c.send("edge", usage(id, 0, 5, 0))
	c.recv()
	dropped := r.srv.m.dropped.WithLabelValues("store")
	for i := range maxChargeTries {
		if got := testutil.ToFloat64(dropped); got != 0 {
			t.Fatalf("after %d failed rounds: %v dropped, want 0", i, got)
		}
		r.clock.Add(time.Second)
		r.srv.Round(context.Background())
		c.recv()
	}
	if got := testutil.ToFloat64(dropped); got != 5 {
		t.Errorf("after %d failed rounds: %v dropped, want 5", maxChargeTries, got)
	}
	if got := testutil.ToFloat64(r.srv.m.errors.WithLabelValues("charge")); got != maxChargeTries {
		t.Errorf("ratelimitd_rlqs_store_errors_total{op=charge} %v, want %d", got, maxChargeTries)
	}
	// The store back, the dropped usage is not charged again.
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	r.clock.Add(time.Second)
	r.srv.Round(context.Background())
	c.recv()
	b := &bucket{st: &stream{domain: "edge"}, entries: toEntries("tenant", "a")}
	r.srv.match(b, r.srv.set.Load())
	out := make([]algo.Decision, 1)
	if err := r.store.Take(context.Background(), []algo.Hit{{Key: b.keys[0], Limit: b.specs[0].Limit}}, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Remaining != 1000 {
		t.Errorf("remaining %d after the dropped usage, want 1000", out[0].Remaining)
	}
}

// TestBucketBound: past MaxBucketsPerStream a stream's new buckets are
// not tracked: a limited rule's bucket is answered DENY_ALL, a shadow or
// unlimited one ALLOW_ALL, each counted, and the usage of those that
// would be charged counted as dropped; a bucket past the bound is tracked
// once another one is abandoned.
func TestBucketBound(t *testing.T) {
	r := newRig(t, kindsConfig, nil, func(o *Options) {
		o.MaxBucketsPerStream = 2
		o.AbandonAfter = 5 * time.Second
	})
	c := r.open()
	search, free := map[string]string{"api": "search"}, map[string]string{"api": "free"}
	trial, img, user := map[string]string{"api": "trial"}, map[string]string{"api": "imgx"}, map[string]string{"api": "freeish"}
	c.send("edge", usage(search, 0, 1, 0), usage(free, 0, 1, 0), usage(trial, 0, 2, 0), usage(img, 0, 4, 0), usage(user, 0, 8, 0))
	resp := c.recv()
	for _, w := range []struct {
		id   map[string]string
		want string
	}{{search, "token_bucket"}, {free, "ALLOW_ALL"}, {trial, "ALLOW_ALL"}, {img, "DENY_ALL"}, {user, "ALLOW_ALL"}} {
		if got := blanketOf(checkTTL(t, action(t, resp, w.id), r.srv.TTL())); got != w.want {
			t.Errorf("bucket %v: %s, want %s", w.id, got, w.want)
		}
	}
	if got := testutil.ToFloat64(r.srv.m.overBound.WithLabelValues("deny_all")); got != 1 {
		t.Errorf("over the bound, deny_all: %v, want 1", got)
	}
	if got := testutil.ToFloat64(r.srv.m.overBound.WithLabelValues("allow_all")); got != 2 {
		t.Errorf("over the bound, allow_all: %v, want 2", got)
	}
	// trial (shadow: charged when tracked) and imgx; not the bucket of no rule.
	if got := testutil.ToFloat64(r.srv.m.dropped.WithLabelValues("bucket_bound")); got != 2+4 {
		t.Errorf("usage dropped past the bound: %v, want 6", got)
	}
	// search and free go silent; imgx keeps reporting and is tracked once
	// they are abandoned.
	r.clock.Add(5 * time.Second)
	c.send("edge", usage(img, time.Second, 0, 1))
	r.srv.Round(context.Background())
	c.send("edge", usage(img, time.Second, 0, 1))
	for deadline := time.Now().Add(10 * time.Second); ; {
		a := actionFor(c.recv(), img)
		if a != nil && blanketOf(a.GetQuotaAssignmentAction().GetRateLimitStrategy()) == "token_bucket" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("imgx not tracked after the other buckets were abandoned")
		}
	}
}

// actionFor is r's action for bucket id, nil when none.
func actionFor(r *rlqspb.RateLimitQuotaResponse, id map[string]string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	for _, a := range r.GetBucketAction() {
		if sameID(a.GetBucketId().GetBucket(), id) {
			return a
		}
	}
	return nil
}

// toEntries turns key, value, ... into policy entries.
func toEntries(kv ...string) []policy.Entry {
	var out []policy.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, policy.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// TestGlobalShadowMode: with Options.ShadowMode every limited bucket is
// answered ALLOW_ALL, even with its budget spent, and its usage is still
// charged.
func TestGlobalShadowMode(t *testing.T) {
	r := newRig(t, tenantConfig, nil, func(o *Options) { o.ShadowMode = true })
	c := r.open()
	id := map[string]string{"tenant": "a"}
	c.send("edge", usage(id, 0, 1500, 0))
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), r.srv.TTL())); got != "ALLOW_ALL" {
		t.Fatalf("first answer in shadow mode: %s, want ALLOW_ALL", got)
	}
	r.clock.Add(time.Second)
	r.srv.Round(context.Background())
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), r.srv.TTL())); got != "ALLOW_ALL" {
		t.Errorf("budget spent, shadow mode: %s, want ALLOW_ALL", got)
	}
	b := &bucket{st: &stream{domain: "edge"}, entries: toEntries("tenant", "a")}
	r.srv.match(b, r.srv.set.Load())
	out := make([]algo.Decision, 1)
	if err := r.store.Take(context.Background(), []algo.Hit{{Key: b.keys[0], Limit: b.specs[0].Limit}}, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed || out[0].Remaining != 0 {
		t.Errorf("after 1500 reported of 1000: %+v, want the usage charged (denied, 0 remaining)", out[0])
	}
}

// TestChargeOutOfTimeKept: usage whose charge ran out of the round's time
// (the caller's deadline, the store not failing) is not dropped after
// maxChargeTries rounds, only after maxChargeRounds.
func TestChargeOutOfTimeKept(t *testing.T) {
	r := newRig(t, tenantConfig, nil)
	f := &flakyStore{Store: r.store, down: true, err: fmt.Errorf("not decided within the caller's deadline: %w", context.DeadlineExceeded)}
	r.srv.opt.Store = f
	c := r.open()
	c.send("edge", usage(map[string]string{"tenant": "a"}, 0, 5, 0))
	c.recv()
	dropped := r.srv.m.dropped.WithLabelValues("store")
	for i := range maxChargeRounds {
		if got := testutil.ToFloat64(dropped); got != 0 {
			t.Fatalf("after %d rounds out of time: %v dropped, want 0", i, got)
		}
		r.clock.Add(time.Second)
		r.srv.Round(context.Background())
		c.recv()
	}
	if got := testutil.ToFloat64(dropped); got != 5 {
		t.Errorf("after %d rounds out of time: %v dropped, want 5", maxChargeRounds, got)
	}
}

// TestTokenBucketBurstHandedOff: a token_bucket rule's burst is shared by
// the streams' buckets and its rate by their rates, so the fleet admits at
// most the burst at once and then the rate, as the rule itself does.
func TestTokenBucketBurstHandedOff(t *testing.T) {
	set := loadSet(t, `domain: edge
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 40}
`)
	m, ok := set.Match("edge", toEntries("api", "x"))
	if !ok {
		t.Fatal("no match")
	}
	sp := &m.Rule.Limits[0]
	for _, n := range []int{1, 2, 3, 7, 40} {
		p := planFor(sp, n, DefaultHeadroom, 0, false, time.Second)
		var tokens, perSec float64
		each := p.budget / int64(n)
		for range n {
			tb := tokenBucket(share{maxTokens: p.burst, rate: each, window: sp.Window})
			tokens += float64(tb.GetMaxTokens())
			perSec += float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
		}
		if tokens > 40 || tokens < 40-float64(n) {
			t.Errorf("%d streams: buckets hold %v tokens together, want the burst 40 (less rounding)", n, tokens)
		}
		if perSec > 100 || perSec < 90 {
			t.Errorf("%d streams: rates %v/s together, want at most 100 and at least 90", n, perSec)
		}
	}
}
