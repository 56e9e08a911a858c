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

	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// durableConfig has a fast limit and a durable 2-per-day limit.
const durableConfig = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: plan\n    rate_limit: {unit: day, requests_per_unit: 2, store: durable}\n"

// TestServerDurableStore: with --durable-url (password from
// --durable-password-file) serve loads a config with store: durable,
// decides its durable limit on PostgreSQL, reports the durable store's
// gRPC health and exports its metrics; the password never reaches the
// log. Without --durable-url the same config is refused at its line.
// --durable-timeout is long so that slow scheduling cannot turn the third
// call into the limit's failure mode (open).
func TestServerDurableStore(t *testing.T) {
	pg := pgtest.Start(t)
	db := pg.CreateDB(t)
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "c.yaml"), durableConfig)
	pwFile := filepath.Join(t.TempDir(), "pw")
	writeTestFile(t, pwFile, pg.Password+"\n")
	o, _, err := serveopts.Parse([]string{"--config=" + dir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=", "--shutdown-grace=5s",
		"--durable-url=" + pg.URLNoPassword(db), "--durable-password-file=" + pwFile, "--durable-timeout=5s"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testproc.Buffer{}
	s, err := newServer(o, gcpolicy.Policy{PercentSource: gcpolicy.SourceEnv, LimitSource: gcpolicy.SourceEnv}, nil, logs)
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

// TestServerDurableStartsWithoutPostgres: with PostgreSQL down, serve
// starts at once: the service is SERVING, ratelimitd.durable NOT_SERVING,
// and a durable limit with failure_mode: closed is denied within the
// caller's deadline while the fast limit is counted. Once PostgreSQL
// accepts connections, ratelimitd.durable turns SERVING within a second
// without any traffic, and the durable limit is counted.
func TestServerDurableStartsWithoutPostgres(t *testing.T) {
	pg := pgtest.Start(t)
	db := pg.CreateDB(t)
	pg.Kill()
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "c.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: plan\n    rate_limit: {unit: day, requests_per_unit: 2, store: durable, failure_mode: closed}\n")
	o, _, err := serveopts.Parse([]string{"--config=" + dir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=", "--shutdown-grace=5s",
		// A long durable budget: the first calls after the restart must
		// not time out into failure_mode: closed.
		"--durable-url=" + pg.URL(db), "--durable-timeout=5s"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testproc.Buffer{}
	start := time.Now()
	s, err := newServer(o, gcpolicy.Policy{PercentSource: gcpolicy.SourceEnv, LimitSource: gcpolicy.SourceEnv}, nil, logs)
	if err != nil {
		t.Fatalf("serve with PostgreSQL down: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("serve with PostgreSQL down took %v to start", took)
	}
	runServer(t, s)
	cc := testproc.Dial(t, s.grpcLn.Addr().String())
	if err := testproc.WaitHealth(cc, "", healthpb.HealthCheckResponse_SERVING, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	hc := healthpb.NewHealthClient(cc)
	if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: durableHealth}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("%s with PostgreSQL down: %v %v, want NOT_SERVING", durableHealth, r.GetStatus(), err)
	}
	client := rlsv3.NewRateLimitServiceClient(cc)
	plan := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("plan", "acme")}}
	fast := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("k", "a")}}
	const budget = 500 * time.Millisecond
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		t0 := time.Now()
		resp, err := client.ShouldRateLimit(ctx, plan)
		took := time.Since(t0)
		cancel()
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("durable call %d with PostgreSQL down: %v %v, want OVER_LIMIT (failure_mode: closed)", i, resp.GetOverallCode(), err)
		}
		if took > budget {
			t.Errorf("durable call %d took %v, the caller's deadline is %v", i, took, budget)
		}
		if resp, err := client.ShouldRateLimit(context.Background(), fast); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("fast call %d with PostgreSQL down: %v %v, want OK", i, resp.GetOverallCode(), err)
		}
	}
	if v, err := testproc.MetricValue(s.reg, "ratelimitd_durable_healthy", nil); err != nil || v != 0 {
		t.Errorf("ratelimitd_durable_healthy = %v (%v) with PostgreSQL down, want 0", v, err)
	}
	pg.Restart()
	up := time.Now()
	if err := testproc.WaitHealth(cc, durableHealth, healthpb.HealthCheckResponse_SERVING, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	took := time.Since(up)
	t.Logf("%s SERVING %v after PostgreSQL accepted connections", durableHealth, took)
	if took > time.Second {
		t.Errorf("%s SERVING %v after PostgreSQL accepted connections, want within 1s", durableHealth, took)
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(context.Background(), plan)
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("durable call %d after PostgreSQL came: %v %v, want %v", i+1, resp.GetOverallCode(), err, want)
		}
	}
	if n := pg.QueryInt(t, db, "SELECT sum(count) FROM ratelimitd_counters"); n != 2 {
		t.Errorf("PostgreSQL counts %d, want 2", n)
	}
	if strings.Contains(logs.String(), pg.Password) {
		t.Error("the PostgreSQL password is in the log")
	}
}

// TestDurableFlagsMapped: --durable-async-commit and
// --durable-connect-timeout reach postgres.Options; their defaults are
// the package's.
func TestDurableFlagsMapped(t *testing.T) {
	o, _, err := serveopts.Parse([]string{"--durable-url=postgres://u@127.0.0.1:5432/q", "--durable-async-commit", "--durable-connect-timeout=7s"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	po := serveopts.DurableOptions(o, "")
	if !po.AsyncCommit || po.ConnectTimeout != 7*time.Second {
		t.Errorf("AsyncCommit %v, ConnectTimeout %v; want true, 7s", po.AsyncCommit, po.ConnectTimeout)
	}
	o, _, err = serveopts.Parse([]string{"--durable-url=postgres://u@127.0.0.1:5432/q"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	po = serveopts.DurableOptions(o, "")
	if po.AsyncCommit || po.ConnectTimeout != postgres.DefaultConnectTimeout {
		t.Errorf("defaults: AsyncCommit %v, ConnectTimeout %v; want false, %v", po.AsyncCommit, po.ConnectTimeout, postgres.DefaultConnectTimeout)
	}
	o, _, err = serveopts.Parse([]string{"--durable-url=postgres://u@127.0.0.1:5432/q"}, env("RATELIMITD_DURABLE_ASYNC_COMMIT", "true"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !serveopts.DurableOptions(o, "").AsyncCommit {
		t.Error("RATELIMITD_DURABLE_ASYNC_COMMIT=true: AsyncCommit false")
	}
}

// runServer runs s until the test ends, then shuts it down within 10 s.
func runServer(t *testing.T, s *server) {
	t.Helper()
	ran := make(chan error, 1)
	go func() { ran <- s.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-ran
	})
}
