package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// frozenConfig has a fast limit of 4 a minute and a durable quota with
// failure_mode open on the same descriptor.
const frozenConfig = "domain: d\ndescriptors:\n  - key: tenant\n    rate_limits:\n" +
	"      - {unit: minute, requests_per_unit: 4}\n" +
	"      - {unit: day, requests_per_unit: 1000, store: durable, failure_mode: open}\n"

// TestServerDurableFrozenFailsOpen: with PostgreSQL frozen (SIGSTOP), a
// durable limit with failure_mode open admits within the caller's
// deadline, before and after the durable breaker opens, instead of
// DEADLINE_EXCEEDED, and the fast limit of the same request still denies
// its fifth request.
func TestServerDurableFrozenFailsOpen(t *testing.T) {
	pg := pgtest.Start(t)
	db := pg.CreateDB(t)
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "c.yaml"), frozenConfig)
	o, _, err := serveopts.Parse([]string{"--config=" + dir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=", "--shutdown-grace=5s",
		"--durable-url=" + pg.URL(db)}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newServer(o, gcpolicy.Policy{PercentSource: gcpolicy.SourceEnv, LimitSource: gcpolicy.SourceEnv}, nil, &testproc.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	runServer(t, s)
	cc := testproc.Dial(t, s.grpcLn.Addr().String())
	// The server's own health (the config loaded) and the durable store's.
	for _, name := range []string{"", durableHealth} {
		if err := testproc.WaitHealth(cc, name, healthpb.HealthCheckResponse_SERVING, 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	client := rlsv3.NewRateLimitServiceClient(cc)
	r := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("tenant", "acme")}}
	call := func() (rlsv3.RateLimitResponse_Code, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, r)
		return resp.GetOverallCode(), err
	}
	if c, err := call(); err != nil || c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("before the freeze: %v %v, want OK", c, err)
	}
	pg.Stop()
	t.Cleanup(pg.Cont) // before the server's shutdown
	for i := range 3 {
		if c, err := call(); err != nil || c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("frozen, call %d: %v %v, want OK (failure_mode open)", i+2, c, err)
		}
	}
	if c, err := call(); err != nil || c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("frozen, call 5: %v %v, want OVER_LIMIT (the fast limit)", c, err)
	}
	// Other tenants until the durable breaker is open: each admitted.
	for i := 0; ; i++ {
		if v, _ := testproc.MetricValue(s.reg, "ratelimitd_durable_circuit_state", map[string]string{"state": "open"}); v == 1 {
			break
		}
		if i == 200 {
			t.Fatal("the durable breaker did not open after 200 frozen calls")
		}
		r = &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("tenant", fmt.Sprint("t", i))}}
		if c, err := call(); err != nil || c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("frozen, tenant %d: %v %v, want OK (failure_mode open)", i, c, err)
		}
	}
	// A tenant of its own: the breaker may have opened before the loop
	// made a call, with r still acme's, already over the fast limit.
	r = &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("tenant", "open")}}
	for i := range 3 {
		if c, err := call(); err != nil || c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("breaker open, call %d: %v %v, want OK (failure_mode open)", i, c, err)
		}
	}
	if v, err := testproc.MetricValue(s.reg, "ratelimitd_durable_errors_total", map[string]string{"cause": "timeout"}); err != nil || v == 0 {
		t.Errorf("durable_errors{timeout} = %v (%v), want > 0", v, err)
	}
}
