package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// durableConfig has a fast limit and a durable 2-per-day limit.
const durableConfig = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: plan\n    rate_limit: {unit: day, requests_per_unit: 2, store: durable}\n"

// TestServerDurableStore: with --durable-url (password from
// --durable-password-file) serve loads a config with store: durable,
// decides its durable limit on PostgreSQL, reports the durable store's
// gRPC health and exports its metrics; the password never reaches the
// log. Without --durable-url the same config is refused at its line.
func TestServerDurableStore(t *testing.T) {
	pg := pgtest.Start(t)
	db := pg.CreateDB(t)
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "c.yaml"), durableConfig)
	pwFile := filepath.Join(t.TempDir(), "pw")
	writeTestFile(t, pwFile, pg.Password+"\n")
	o, _, err := parseServe([]string{"--config=" + dir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=", "--shutdown-grace=5s",
		"--durable-url=" + pg.URLNoPassword(db), "--durable-password-file=" + pwFile}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testproc.Buffer{}
	s, err := newServer(o, gcPolicy{PercentSource: sourceEnv, LimitSource: sourceEnv}, nil, logs)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- s.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-ran
	})
	cc := testproc.Dial(t, s.grpcLn.Addr().String())
	for _, name := range []string{"", durableHealth} {
		if err := testproc.WaitHealth(cc, name, healthpb.HealthCheckResponse_SERVING, 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	client := rlsv3.NewRateLimitServiceClient(cc)
	plan := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("k", "a"), testproc.Desc("plan", "acme")}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(context.Background(), plan)
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("call %d: %v %v, want %v", i+1, resp.GetOverallCode(), err, want)
		}
	}
	if n := pg.QueryInt(t, db, "SELECT count(*) FROM ratelimitd_counters"); n != 1 {
		t.Errorf("%d durable counters in PostgreSQL, want 1", n)
	}
	for _, m := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ratelimitd_durable_healthy", nil, 1},
		{"ratelimitd_durable_circuit_state", map[string]string{"state": "closed"}, 1},
		{"ratelimitd_durable_refunds_total", map[string]string{"result": "ok"}, 1},
	} {
		if v, err := testproc.MetricValue(s.reg, m.name, m.labels); err != nil || v != m.want {
			t.Errorf("%s%v = %v (%v), want %v", m.name, m.labels, v, err, m.want)
		}
	}
	if strings.Contains(logs.String(), pg.Password) {
		t.Error("the PostgreSQL password is in the log")
	}
	if !strings.Contains(logs.String(), `"msg":"durable store"`) && !strings.Contains(logs.String(), "msg=\"durable store\"") {
		t.Errorf("no durable store startup line:\n%s", logs.String())
	}

	// Without a durable store the config never loads.
	var out, errOut strings.Builder
	if code := validate([]string{dir}, env(), &out, &errOut); code != 1 || !strings.Contains(out.String()+errOut.String(), "c.yaml:6: descriptor \"d.plan\": store: durable needs a durable store") {
		t.Errorf("validate without --durable: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := validate([]string{"--durable", dir}, env(), &out, &errOut); code != 0 {
		t.Errorf("validate --durable: exit %d\n%s%s", code, out.String(), errOut.String())
	}
}
