package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestRLQSServeAndHandoff: the binary serves RLQS on its gRPC port with the
// RLS: a bucket's first report is answered with a token bucket, rounds
// follow every --rlqs-interval, and on SIGTERM the stream gets its
// assignment again with a 1 s TTL and ends before the process exits 0.
func TestRLQSServeAndHandoff(t *testing.T) {
	p := start(t, startOpts{args: []string{"--config", filepath.Join(repoRoot(t), "examples/rlqs")}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{"api": "search", "tenant": "acme"}
	if err := st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "edge-rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqspb.BucketId{Bucket: id}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1,
	}}}); err != nil {
		t.Fatal(err)
	}
	ttlOf := func(r *rlqspb.RateLimitQuotaResponse) time.Duration {
		t.Helper()
		as := r.GetBucketAction()
		if len(as) != 1 || as[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
			t.Fatalf("want one token-bucket assignment, got %v\n%s", r, p.Logs())
		}
		return as[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration()
	}
	for i := range 2 { // the first report's answer, then a round's
		r, err := st.Recv()
		if err != nil {
			t.Fatalf("response %d: %v\n%s", i, err, p.Logs())
		}
		if ttl := ttlOf(r); ttl != 2*time.Second {
			t.Errorf("response %d: TTL %s, want 2s", i, ttl)
		}
	}
	exited := p.terminate()
	// Rounds may still arrive until the handoff; the last response before
	// the stream ends is the handoff.
	var last *rlqspb.RateLimitQuotaResponse
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream ended with %v, want EOF after the handoff\n%s", err, p.Logs())
		}
		last = r
	}
	if last == nil || ttlOf(last) != time.Second {
		t.Errorf("handoff %v, want the assignment again with a 1 s TTL", last)
	}
	<-exited
	if code := p.exitCode(t, 15*time.Second); code != 0 {
		t.Errorf("exit code %d, want 0\n%s", code, p.Logs())
	}
}

// rlqsEnvoy is one Envoy's stream in the multi-process test: it reports a
// steady demand every second and keeps the latest assignment.
type rlqsEnvoy struct {
	mu   sync.Mutex
	rate float64 // tokens per second + max_tokens of the latest token bucket
	fill float64 // tokens per second of the latest token bucket
	done chan struct{}
}

// allowed is what the Envoy admitted of n requests in a second under its
// latest assignment, as Envoy's token bucket would: its fill rate.
func (e *rlqsEnvoy) allowed(n uint64) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return min(n, uint64(e.fill))
}

func (e *rlqsEnvoy) get() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rate
}

func (e *rlqsEnvoy) getFill() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fill
}

// runRLQSEnvoy streams to cc until ctx ends or the stream breaks (closing
// done): a first report, then one per second with demand per second.
func runRLQSEnvoy(ctx context.Context, t *testing.T, cc *grpc.ClientConn, e *rlqsEnvoy, demand uint64) {
	st, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Error(err)
		close(e.done)
		return
	}
	id := &rlqspb.BucketId{Bucket: map[string]string{"api": "search", "tenant": "acme"}}
	report := func(el time.Duration, n uint64) error {
		ok := e.allowed(n)
		return st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "edge-rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: id, TimeElapsed: durationpb.New(el), NumRequestsAllowed: ok, NumRequestsDenied: n - ok,
		}}})
	}
	go func() {
		defer close(e.done)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			for _, a := range r.GetBucketAction() {
				if tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb != nil {
					e.mu.Lock()
					e.fill = float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
					e.rate = float64(tb.GetMaxTokens()) + e.fill
					e.mu.Unlock()
				}
			}
		}
	}()
	if report(0, 1) != nil {
		return
	}
	go func() {
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-e.done:
				return
			case <-tk.C:
				if report(time.Second, demand) != nil {
					return
				}
			}
		}
	}()
}

// TestRLQSReplicasShareOneLimit: two ratelimitd processes on one
// redis-server divide one limit (1000/s) among four Envoys, two on each;
// once the division has settled (the four equal demands get equal
// rates), the Envoys' buckets together (a second of their rates plus
// their full buckets) reach the limit and never pass it. One process is
// killed (SIGKILL, no handoff); its Envoys reconnect to the other, and
// the division again settles, reaching the limit without passing it.
//
// Settled, not merely summing to the limit: while a stream's demand is
// becoming known, the two replicas' rounds, which run at different
// moments, divide by the views of different rounds, so the sum can pass
// the limit until the later round runs (docs/rlqs.md, Replicas); an
// unequal division that sums to the limit is such a moment.
func TestRLQSReplicasShareOneLimit(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	cfg := filepath.Join(repoRoot(t), "examples/rlqs")
	args := []string{"--config", cfg, "--backend=redis", "--redis-url", srv.URL()}
	a, b := start(t, startOpts{args: args}), start(t, startOpts{args: args})
	ca, cb := a.dial(t), b.dial(t)
	a.waitServing(t, ca, "")
	b.waitServing(t, cb, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	const limit = 1000
	envoys := make([]*rlqsEnvoy, 4)
	for i := range envoys {
		envoys[i] = &rlqsEnvoy{done: make(chan struct{})}
		cc := ca
		if i%2 == 1 {
			cc = cb
		}
		runRLQSEnvoy(ctx, t, cc, envoys[i], 2000)
	}
	total := func() float64 {
		var s float64
		for _, e := range envoys {
			s += e.get()
		}
		return s
	}
	// Steady: the division settles (equal demands, rates equal but for
	// rounding) and reaches at least 90 % of the limit, then stays within
	// it for five more seconds.
	steady := func(phase string) {
		t.Helper()
		eventually(t, 30*time.Second, func() string {
			lo, hi := envoys[0].getFill(), envoys[0].getFill()
			for _, e := range envoys[1:] {
				lo, hi = min(lo, e.getFill()), max(hi, e.getFill())
			}
			if hi-lo > 1 {
				return fmt.Sprintf("%s: the four Envoys' rates range from %.1f to %.1f per second for equal demands, want one rate", phase, lo, hi)
			}
			if got := total(); got < 0.9*limit || got > limit {
				return fmt.Sprintf("%s: the four Envoys' buckets hold %.1f per second, want in [%d, %d]", phase, got, limit*9/10, limit)
			}
			return ""
		})
		for range 10 {
			time.Sleep(500 * time.Millisecond)
			if got := total(); got > limit {
				t.Fatalf("%s: the four Envoys' buckets hold %.1f per second, more than the limit %d", phase, got, limit)
			}
		}
	}
	steady("two replicas")

	b.stopOnce.Do(func() {}) // killed, not stopped: no clean exit to expect
	if err := b.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-b.Done()
	for i := 1; i < len(envoys); i += 2 {
		<-envoys[i].done
		envoys[i] = &rlqsEnvoy{done: make(chan struct{})}
		runRLQSEnvoy(ctx, t, ca, envoys[i], 2000)
	}
	steady("after the kill")
}
