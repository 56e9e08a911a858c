package e2e

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"
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
