package main

import (
	"context"
	"io"
	"path/filepath"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// TestServerRLQSDurable: serve gives the RLQS server the durable store:
// the usage an Envoy reports on a `store: durable` limit is charged to
// PostgreSQL, and ShouldRateLimit then finds that budget spent.
func TestServerRLQSDurable(t *testing.T) {
	pg := pgtest.Start(t)
	db := pg.CreateDB(t)
	dir := t.TempDir()
	// A year window, so that no run spans a window boundary.
	writeTestFile(t, filepath.Join(dir, "c.yaml"), "domain: d\ndescriptors:\n  - key: plan\n    rate_limit: {unit: year, requests_per_unit: 5, store: durable}\n")
	o, _, err := serveopts.Parse([]string{"--config=" + dir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=", "--shutdown-grace=5s",
		// A durable budget no call needs: this test is about where
		// the usage is counted, not about latency (a timeout would answer
		// with the failure mode, OK).
		"--durable-url=" + pg.URL(db), "--durable-timeout=10s"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The RLQS rounds on a clock the test moves: each Tick is one round.
	clk := clock.NewManual()
	o.RLQS.Clock = clk
	s, err := newServer(o, gcpolicy.Policy{PercentSource: gcpolicy.SourceEnv, LimitSource: gcpolicy.SourceEnv}, nil, &testproc.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	runServer(t, s)
	cc := testproc.Dial(t, s.grpcLn.Addr().String())
	for _, name := range []string{"", durableHealth} {
		if err := testproc.WaitHealth(cc, name, healthpb.HealthCheckResponse_SERVING, 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	answered := make(chan struct{})
	go func() {
		for once := false; ; once = true {
			if _, err := stream.Recv(); err != nil {
				return
			}
			if !once {
				close(answered)
			}
		}
	}()
	if err := stream.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqspb.BucketId{Bucket: map[string]string{"plan": "acme"}}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 5}}}); err != nil {
		t.Fatal(err)
	}
	// A bucket's first report is answered at once; the next round
	// charges the 5 requests to PostgreSQL.
	select {
	case <-answered:
	case <-time.After(20 * time.Second):
		t.Fatal("the RLQS report not answered within 20 s")
	}
	for i := 0; pg.QueryInt(t, db, "SELECT count(*) FROM ratelimitd_counters") == 0; i++ {
		if i == 3 {
			t.Fatalf("no durable counter in PostgreSQL %d rounds after the RLQS report: the usage went elsewhere", i)
		}
		clk.Tick(t)
	}
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(),
		&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("plan", "acme")}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("ShouldRateLimit after 5 of 5 reported over RLQS: %v %v, want OVER_LIMIT", resp.GetOverallCode(), err)
	}
}
