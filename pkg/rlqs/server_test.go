package rlqs

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

const kindsConfig = `domain: edge
descriptors:
  - key: api
    value: search
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: api
    value: "img*"
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 1200}
  - key: api
    value: free
    rate_limit: {unlimited: true}
  - key: api
    value: trial
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: api
    value: batch
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 40}
`

// rig is one Server on a real gRPC listener, on the memory store and a
// frozen clock: nothing runs a round unless the test does.
type rig struct {
	t     testing.TB
	srv   *Server
	store *memory.Store
	clock *fakeClock
	reg   *prometheus.Registry
	conn  *grpc.ClientConn
}

// newRig serves a Server with config cfg ("": none yet) on store (nil: the
// rig's memory store).
func newRig(t testing.TB, cfg string, store Store, mode ...func(*Options)) *rig {
	t.Helper()
	clock := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	ms, err := memory.New(memory.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if store == nil {
		store = ms
	}
	reg := prometheus.NewRegistry()
	o := Options{Store: store, Now: clock.Now, Registerer: reg, Replica: "r"}
	for _, f := range mode {
		f(&o)
	}
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != "" {
		srv.SetPolicy(loadSet(t, cfg))
	}
	g := grpc.NewServer()
	srv.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &rig{t: t, srv: srv, store: ms, clock: clock, reg: reg, conn: conn}
}

func loadSet(t testing.TB, cfg string) *policy.Set {
	t.Helper()
	set, _, err := policy.LoadSources(policy.LoadOptions{}, policy.Source{Name: "rlqs.yaml", Data: []byte(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

type client struct {
	t  testing.TB
	st grpc.BidiStreamingClient[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]
}

func (r *rig) open() *client {
	r.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r.t.Cleanup(cancel)
	st, err := rlqspb.NewRateLimitQuotaServiceClient(r.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	return &client{t: r.t, st: st}
}

func usage(id map[string]string, elapsed time.Duration, allowed, denied uint64) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqspb.BucketId{Bucket: id},
		TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func (c *client) send(domain string, us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	c.t.Helper()
	if err := c.st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}); err != nil {
		c.t.Fatal(err)
	}
}

// recv returns the next response; it fails the test after 10 s (real
// time) without one: the frozen clock means no round sent it.
func (c *client) recv() *rlqspb.RateLimitQuotaResponse {
	c.t.Helper()
	type res struct {
		r   *rlqspb.RateLimitQuotaResponse
		err error
	}
	ch := make(chan res, 1)
	go func() { r, err := c.st.Recv(); ch <- res{r, err} }()
	select {
	case x := <-ch:
		if x.err != nil {
			c.t.Fatalf("recv: %v", x.err)
		}
		if err := x.r.ValidateAll(); err != nil {
			c.t.Fatalf("response fails Envoy's proto validation: %v", err)
		}
		return x.r
	case <-time.After(10 * time.Second):
		c.t.Fatal("no response")
		return nil
	}
}

// action returns the response's action for bucket id.
func action(t *testing.T, r *rlqspb.RateLimitQuotaResponse, id map[string]string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	t.Helper()
	for _, a := range r.GetBucketAction() {
		if sameID(a.GetBucketId().GetBucket(), id) {
			return a
		}
	}
	t.Fatalf("no action for bucket %v in %v", id, r)
	return nil
}

func checkTTL(t *testing.T, a *rlqspb.RateLimitQuotaResponse_BucketAction, want time.Duration) *typev3.RateLimitStrategy {
	t.Helper()
	qa := a.GetQuotaAssignmentAction()
	if qa == nil {
		t.Fatalf("want a quota assignment, got %v", a)
	}
	if got := qa.GetAssignmentTimeToLive().AsDuration(); got != want {
		t.Errorf("assignment_time_to_live %s, want %s", got, want)
	}
	return qa.GetRateLimitStrategy()
}

func blanketOf(s *typev3.RateLimitStrategy) string {
	if s.GetTokenBucket() != nil {
		return "token_bucket"
	}
	return s.GetBlanketRule().String()
}

// TestFirstReportAnsweredAtOnce: a bucket's first report gets its
// assignment with the clock frozen and no round run, so it is answered
// within the stream's own processing, not at the next round.
func TestFirstReportAnsweredAtOnce(t *testing.T) {
	r := newRig(t, kindsConfig, nil)
	c := r.open()
	id := map[string]string{"api": "search"}
	c.send("edge", usage(id, 0, 1, 0))
	st := checkTTL(t, action(t, c.recv(), id), 2*time.Second)
	tb := st.GetTokenBucket()
	if tb == nil {
		t.Fatalf("want a token bucket, got %v", st)
	}
	// One stream of unknown demand gets a tenth of the limit per window.
	if tb.GetFillInterval().AsDuration() < time.Second || tb.GetFillInterval().AsDuration()%time.Second != 0 {
		t.Errorf("fill_interval %s: want whole seconds >= 1", tb.GetFillInterval().AsDuration())
	}
	rate := float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
	if rate < 9 || rate > 10 {
		t.Errorf("first assignment %.2f/s, want the floor of 10/s (a tenth of 100/s) rounded down", rate)
	}
	if tb.GetMaxTokens() != 5 {
		t.Errorf("max_tokens %d, want 5 (headroom 5 %% of 100 for one stream)", tb.GetMaxTokens())
	}
}

// TestBucketKinds: unlimited, shadow and unmatched buckets are allowed,
// wildcards and unit_multiplier select the rule and its window, and a
// bucket id's keys are matched in sorted order (tenant before user).
func TestBucketKinds(t *testing.T) {
	r := newRig(t, kindsConfig, nil)
	c := r.open()
	cases := []struct {
		id   map[string]string
		want string
	}{
		{map[string]string{"api": "free"}, "ALLOW_ALL"},
		{map[string]string{"api": "trial"}, "ALLOW_ALL"},
		{map[string]string{"api": "unknown"}, "ALLOW_ALL"},
		{map[string]string{"api": "img-large"}, "token_bucket"},
		{map[string]string{"user": "u1", "tenant": "t1"}, "token_bucket"},
	}
	for _, tc := range cases {
		c.send("edge", usage(tc.id, 0, 1, 0))
		a := action(t, c.recv(), tc.id)
		st := checkTTL(t, a, 2*time.Second)
		if got := blanketOf(st); got != tc.want {
			t.Errorf("bucket %v: %s, want %s", tc.id, got, tc.want)
		}
		if tc.id["api"] == "img-large" {
			// 1200 per 2 minutes: the bucket refills over the 120 s window.
			tb := st.GetTokenBucket()
			if f := tb.GetFillInterval().AsDuration(); f%(120*time.Second) != 0 {
				t.Errorf("img*: fill_interval %s, want a multiple of the 120 s window", f)
			}
		}
	}
	// The shadow rule's usage is charged (counted), its bucket still allowed.
	c.send("edge", usage(map[string]string{"api": "trial"}, time.Second, 9, 0))
	waitFor(t, "report processed", func() bool { return r.srv.reported.Load() >= 6 })
	r.srv.Round(context.Background())
	set := r.srv.set.Load()
	m, _ := set.Match("edge", []policy.Entry{{Key: "api", Value: "trial"}})
	d := make([]algo.Decision, 1)
	if err := r.store.Take(context.Background(), []algo.Hit{{Key: set.Key(m, 0), Limit: m.Rule.Limits[0].Limit}}, d); err != nil {
		t.Fatal(err)
	}
	if d[0].Remaining != 0 || d[0].Allowed {
		t.Errorf("shadow rule after 1+9 charged of 5: remaining %d allowed %v, want 0 and denied", d[0].Remaining, d[0].Allowed)
	}
}

// TestWindowedBudgetDeniesUntilReset: an hourly budget spent gets DENY_ALL
// until the window resets, then a token bucket again.
func TestWindowedBudgetDeniesUntilReset(t *testing.T) {
	r := newRig(t, kindsConfig, nil)
	c := r.open()
	id := map[string]string{"api": "batch"}
	r.clock.t = time.Date(2026, 12, 6, 12, 59, 0, 0, time.UTC)
	c.send("edge", usage(id, 0, 1, 0))
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), 2*time.Second)); got != "token_bucket" {
		t.Fatalf("first assignment %s, want token_bucket", got)
	}
	r.clock.Add(time.Second)
	c.send("edge", usage(id, time.Second, 49, 30))
	waitFor(t, "report processed", func() bool { return r.srv.reported.Load() >= 2 })
	r.srv.Round(context.Background())
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), 2*time.Second)); got != "DENY_ALL" {
		t.Fatalf("after 50 of 50 this hour: %s, want DENY_ALL", got)
	}
	r.clock.t = time.Date(2026, 12, 6, 13, 0, 0, 0, time.UTC)
	c.send("edge", usage(id, time.Second, 0, 20))
	waitFor(t, "report processed", func() bool { return r.srv.reported.Load() >= 3 })
	r.srv.Round(context.Background())
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), 2*time.Second)); got != "token_bucket" {
		t.Fatalf("in the next hour: %s, want token_bucket", got)
	}
}

// TestAbandonAfterSilence: a bucket silent for AbandonAfter is abandoned.
func TestAbandonAfterSilence(t *testing.T) {
	r := newRig(t, kindsConfig, nil, func(o *Options) { o.AbandonAfter = 5 * time.Second })
	c := r.open()
	id := map[string]string{"api": "search"}
	c.send("edge", usage(id, 0, 1, 0))
	c.recv()
	r.clock.Add(4 * time.Second)
	r.srv.Round(context.Background())
	if a := action(t, c.recv(), id); a.GetAbandonAction() != nil {
		t.Fatal("abandoned after 4 s of a 5 s silence")
	}
	r.clock.Add(time.Second)
	r.srv.Round(context.Background())
	if a := action(t, c.recv(), id); a.GetAbandonAction() == nil {
		t.Fatalf("after 5 s of silence: %v, want AbandonAction", a)
	}
	if got := testutil.ToFloat64(r.srv.m.assignments.WithLabelValues("abandon")); got != 1 {
		t.Errorf("ratelimitd_rlqs_assignments_total{action=abandon} %v, want 1", got)
	}
}

// TestReloadResends: a new config reaches every stream at once.
func TestReloadResends(t *testing.T) {
	r := newRig(t, kindsConfig, nil)
	c := r.open()
	id := map[string]string{"api": "search"}
	c.send("edge", usage(id, 0, 1, 0))
	c.recv()
	r.srv.SetPolicy(loadSet(t, strings.Replace(kindsConfig, "value: search\n    rate_limit: {unit: second, requests_per_unit: 100}", "value: search\n    rate_limit: {unlimited: true}", 1)))
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), 2*time.Second)); got != "ALLOW_ALL" {
		t.Fatalf("after the reload to unlimited: %s, want ALLOW_ALL", got)
	}
}

// TestShutdownHandsOff: on Shutdown each stream gets its assignments with a
// TTL of one second and ends; new streams are refused.
func TestShutdownHandsOff(t *testing.T) {
	r := newRig(t, kindsConfig, nil)
	c := r.open()
	id := map[string]string{"api": "search"}
	c.send("edge", usage(id, 0, 1, 0))
	first := checkTTL(t, action(t, c.recv(), id), 2*time.Second)
	r.srv.Shutdown()
	st := checkTTL(t, action(t, c.recv(), id), time.Second)
	if blanketOf(st) != blanketOf(first) {
		t.Errorf("handoff strategy %v, want the last one %v", st, first)
	}
	if _, err := c.st.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the handoff: %v, want the stream ended (EOF)", err)
	}
	if _, err := r.open().st.Recv(); err == nil || errors.Is(err, io.EOF) {
		t.Errorf("a stream after Shutdown: %v, want Unavailable", err)
	}
}

// failingStore fails every Take.
type failingStore struct{}

func (failingStore) Take(context.Context, []algo.Hit, []algo.Decision) error {
	return errors.New("store down")
}

// TestChargeFailureMode: when the store fails, failure_mode closed denies
// and open keeps dividing; both are counted.
func TestChargeFailureMode(t *testing.T) {
	cfg := `domain: edge
descriptors:
  - key: api
    value: open
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: api
    value: closed
    rate_limit: {unit: second, requests_per_unit: 100, failure_mode: closed}
`
	r := newRig(t, cfg, failingStore{})
	c := r.open()
	open, closed := map[string]string{"api": "open"}, map[string]string{"api": "closed"}
	c.send("edge", usage(open, 0, 1, 0), usage(closed, 0, 1, 0))
	c.recv()
	r.clock.Add(time.Second)
	r.srv.Round(context.Background())
	resp := c.recv()
	if got := blanketOf(checkTTL(t, action(t, resp, open), 2*time.Second)); got != "token_bucket" {
		t.Errorf("failure_mode open: %s, want token_bucket", got)
	}
	if got := blanketOf(checkTTL(t, action(t, resp, closed), 2*time.Second)); got != "DENY_ALL" {
		t.Errorf("failure_mode closed: %s, want DENY_ALL", got)
	}
	if got := testutil.ToFloat64(r.srv.m.errors.WithLabelValues("charge")); got != 1 {
		t.Errorf("ratelimitd_rlqs_store_errors_total{op=charge} %v, want 1", got)
	}
}

// TestBucketsNeverOvershootWindow: for any number of streams up to
// headroom × limit, the buckets full plus one window of the rates Envoy
// derives from the assignments never exceed the limit.
func TestBucketsNeverOvershootWindow(t *testing.T) {
	for _, limit := range []uint32{20, 100, 1000, 12345} {
		for _, unit := range []policy.Unit{policy.Second, policy.Minute, policy.Hour} {
			sp := &policy.Spec{RequestsPerUnit: limit, Unit: unit, UnitMultiplier: 1, Window: unitLen(unit)}
			for n := 1; float64(n) <= DefaultHeadroom*float64(limit); n++ {
				p := planFor(sp, n, DefaultHeadroom, 0, false, time.Second)
				var total float64
				each := p.budget / int64(n)
				for range n {
					tb := tokenBucket(share{maxTokens: p.burst, rate: each, window: sp.Window})
					perSec := float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
					total += float64(tb.GetMaxTokens()) + perSec*sp.Window.Seconds()
				}
				if total > float64(limit)+1e-6 {
					t.Fatalf("limit %d per %s, %d streams: full buckets + one window = %.2f > %d", limit, sp.Window, n, total, limit)
				}
			}
		}
	}
}

func unitLen(u policy.Unit) time.Duration {
	switch u {
	case policy.Minute:
		return time.Minute
	case policy.Hour:
		return time.Hour
	}
	return time.Second
}
