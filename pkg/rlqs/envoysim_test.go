package rlqs

import (
	"context"
	"io"
	"math"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// This file is a simulated Envoy rate_limit_quota client written against
// go-control-plane's types, behaving as Envoy's client does: one stream per
// Envoy and domain; a bucket's first request is decided by the
// no-assignment behaviour (allow all) and reported at once with
// time_elapsed 0, then the bucket is reported every interval with whole-
// second time_elapsed and the domain repeated; token buckets start full,
// refill continuously at tokens_per_fill per whole second of fill_interval,
// and keep their fill ratio when the assignment changes; only the whole
// seconds of assignment_time_to_live count (0 expires at once), and an
// expired assignment falls back to allow all. The server side of each
// stream runs in memory, so that the test drives time with a fake clock.

// fakeClock is the injected clock of the servers, the stores and the Envoys.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// memStream is the server side of one stream, in memory: Send delivers to
// the Envoy synchronously.
type memStream struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelFunc
	in     chan *rlqspb.RateLimitQuotaUsageReports
	envoy  *simEnvoy
}

func (m *memStream) Context() context.Context { return m.ctx }

func (m *memStream) Recv() (*rlqspb.RateLimitQuotaUsageReports, error) {
	select {
	case r := <-m.in:
		return r, nil
	case <-m.ctx.Done():
		return nil, io.EOF
	}
}

func (m *memStream) Send(r *rlqspb.RateLimitQuotaResponse) error {
	m.envoy.receive(r)
	return nil
}

// simBucket is one Envoy bucket.
type simBucket struct {
	id       map[string]string
	strategy *typev3.RateLimitStrategy // nil: no assignment yet
	expires  time.Time
	tokens   float64
	maxT     float64
	rate     float64 // tokens per second
	at       time.Time

	allowed, denied uint64
	lastReport      time.Time
}

// simEnvoy is one Envoy with one domain and one bucket.
type simEnvoy struct {
	t      testing.TB
	clock  *fakeClock
	domain string
	id     map[string]string

	mu        sync.Mutex
	b         *simBucket
	responses int
	// violations are assignments Envoy's client would misread.
	violations []string
	// fallback counts requests admitted without a live assignment.
	fallback int64

	srv    *Server
	stream *memStream
	fresh  bool // the current stream has not seen the bucket yet
}

// connect opens a stream to srv.
func (e *simEnvoy) connect(srv *Server) {
	ctx, cancel := context.WithCancel(context.Background())
	ms := &memStream{ctx: ctx, cancel: cancel, in: make(chan *rlqspb.RateLimitQuotaUsageReports), envoy: e}
	e.srv, e.stream, e.fresh = srv, ms, true
	go func() {
		_ = srv.StreamRateLimitQuotas(ms)
		cancel()
	}()
}

func (e *simEnvoy) broken() bool { return e.stream == nil || e.stream.ctx.Err() != nil }

func (e *simEnvoy) responseCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.responses
}

// receive applies a response as Envoy's client does.
func (e *simEnvoy) receive(r *rlqspb.RateLimitQuotaResponse) {
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.responses++
	for _, a := range r.GetBucketAction() {
		if e.b == nil || !sameID(a.GetBucketId().GetBucket(), e.b.id) {
			continue
		}
		if a.GetAbandonAction() != nil {
			e.b = nil
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		ttl := qa.GetAssignmentTimeToLive()
		if ttl.GetSeconds() < 1 || ttl.GetNanos() != 0 {
			e.violations = append(e.violations, "ttl "+ttl.AsDuration().String())
		}
		st := qa.GetRateLimitStrategy()
		b := e.b
		b.expires = now.Add(time.Duration(ttl.GetSeconds()) * time.Second)
		if tb := st.GetTokenBucket(); tb != nil {
			fill := tb.GetFillInterval()
			if fill.GetSeconds() < 1 || fill.GetNanos() != 0 {
				e.violations = append(e.violations, "fill_interval "+fill.AsDuration().String())
				continue
			}
			newMax := float64(tb.GetMaxTokens())
			if old := b.strategy.GetTokenBucket(); old != nil && b.maxT > 0 {
				b.refill(now)
				b.tokens = b.tokens / b.maxT * newMax
			} else {
				b.tokens = newMax
			}
			b.maxT, b.at = newMax, now
			b.rate = float64(tb.GetTokensPerFill().GetValue()) / float64(fill.GetSeconds())
		}
		b.strategy = st
	}
}

func sameID(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func (b *simBucket) refill(now time.Time) {
	if dt := now.Sub(b.at).Seconds(); dt > 0 {
		b.tokens = math.Min(b.maxT, b.tokens+b.rate*dt)
	}
	b.at = now
}

// admit decides n requests arriving now and returns how many pass.
func (e *simEnvoy) admit(now time.Time, n int64) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.b
	var ok int64
	switch {
	case b.strategy == nil || !now.Before(b.expires):
		ok = n
		e.fallback += n
	case b.strategy.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL && b.strategy.GetTokenBucket() == nil:
	case b.strategy.GetTokenBucket() != nil:
		b.refill(now)
		ok = min(n, int64(b.tokens))
		b.tokens -= float64(ok)
	default:
		ok = n
	}
	b.allowed += uint64(ok)
	b.denied += uint64(n - ok)
	return ok
}

// report sends the bucket's usage since the last report and waits until the
// server processed it; a first report on a stream also waits for its answer,
// so the answer arrives with the clock standing still.
func (e *simEnvoy) report(now time.Time, first bool) {
	e.mu.Lock()
	b := e.b
	el := time.Duration(0)
	if !first {
		el = now.Sub(b.lastReport) / time.Second * time.Second
	}
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: e.domain, BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:           &rlqspb.BucketId{Bucket: b.id},
		TimeElapsed:        durationpb.New(el),
		NumRequestsAllowed: b.allowed,
		NumRequestsDenied:  b.denied,
	}}}
	b.allowed, b.denied, b.lastReport = 0, 0, now
	before := e.responses
	e.mu.Unlock()

	processed := e.srv.reported.Load()
	select {
	case e.stream.in <- m:
	case <-e.stream.ctx.Done():
		return
	}
	waitFor(e.t, "report processed", func() bool { return e.srv.reported.Load() > processed })
	if e.fresh {
		waitFor(e.t, "first report answered", func() bool { return e.responseCount() > before })
		e.fresh = false
	}
}

// waitFor polls cond (real time) until it holds; the simulation's clock does
// not move meanwhile.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("simulated Envoy: %s: still waiting after 30 s", what)
		}
		time.Sleep(50 * time.Microsecond)
	}
}
