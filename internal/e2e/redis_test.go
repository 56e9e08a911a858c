package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestRedisBackendSharedAcrossReplicas: two ratelimitd replicas on one real
// redis-server share their counters: one through --redis-url, the other
// through envoyproxy/ratelimit's REDIS_URL/REDIS_SOCKET_TYPE (which also
// select the Redis backend).
func TestRedisBackendSharedAcrossReplicas(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 3))

	a := start(t, startOpts{args: []string{"--config", dir, "--backend=redis", "--redis-url", srv.URL(), "--redis-timeout=500ms"}})
	b := start(t, startOpts{args: []string{"--config", dir}, env: []string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + srv.Addr(), "REDIS_TIMEOUT=500ms",
	}})
	ca, cb := a.dial(t), b.dial(t)
	a.waitServing(t, ca, "")
	b.waitServing(t, cb, "")

	wantRemaining := []uint32{2, 1, 0}
	for i, cc := range []any{ca, cb, ca} {
		conn := ca
		if cc == cb {
			conn = cb
		}
		resp := call(t, conn, "e2e", desc("k", "shared"))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != wantRemaining[i] {
			t.Fatalf("call %d: %v remaining %d, want OK %d", i, resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining(), wantRemaining[i])
		}
	}
	if resp := call(t, cb, "e2e", desc("k", "shared")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("4th call across replicas: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	// REDIS_TIMEOUT=500ms is honoured, with a warning: it exceeds Envoy's
	// 20 ms filter timeout.
	if !strings.Contains(b.Logs(), "--redis-timeout is not below Envoy's default rate-limit filter timeout") {
		t.Errorf("no warning about REDIS_TIMEOUT=500ms:\n%s", b.Logs())
	}
}

// TestHealthWaitsForWarmBackend: health says SERVING only once the backend
// is warm: with Redis up, by the time "" is SERVING the script is loaded on
// the server (no request pays for EVAL) and the warm-up is logged; with
// Redis down, "" stays NOT_SERVING for --redis-warmup, then serves (startup
// never requires Redis) with ratelimitd.backend NOT_SERVING until Redis
// answers.
func TestHealthWaitsForWarmBackend(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 3))

	p := start(t, startOpts{args: []string{"--config", dir, "--backend=redis", "--redis-url", srv.URL()}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	ex, err := srv.Do(context.Background(), "SCRIPT", "EXISTS", redis.ScriptSHA(), redis.FastScriptSHA())
	if err != nil || fmt.Sprint(ex) != "[1 1]" {
		t.Errorf("SERVING before both scripts were loaded: SCRIPT EXISTS %v %v", ex, err)
	}
	if logCount(t, p, "backend warm", nil, 1) != 1 {
		t.Errorf("warm-up not logged\n%s", p.Logs())
	}
	if got := health(t, cc, "ratelimitd.backend"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("ratelimitd.backend %v once warm, want SERVING", got)
	}

	down := redistest.Standalone(t)
	down.Kill()
	q := start(t, startOpts{args: []string{"--config", dir, "--backend=redis", "--redis-url", down.URL(), "--redis-warmup=1500ms"}})
	qc := q.dial(t)
	eventually(t, settleWithin, func() string {
		if st, _ := httpGet(t, "http://"+q.http+"/healthcheck"); st != 500 {
			return fmt.Sprintf("/healthcheck %d while warming up against a dead Redis, want 500", st)
		}
		return ""
	})
	if got := health(t, qc, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health %v while warming up against a dead Redis, want NOT_SERVING", got)
	}
	q.waitServing(t, qc, "")
	if logCount(t, q, "backend warm-up did not finish", nil, 1) != 1 {
		t.Errorf("the warm-up bound was not logged\n%s", q.Logs())
	}
	if got := health(t, qc, "ratelimitd.backend"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("ratelimitd.backend %v with Redis down, want NOT_SERVING", got)
	}
	down.Start()
	down.WaitReady()
	eventually(t, settleWithin, func() string {
		if got := health(t, qc, "ratelimitd.backend"); got != healthpb.HealthCheckResponse_SERVING {
			return fmt.Sprintf("ratelimitd.backend %v after Redis started", got)
		}
		return ""
	})
	if n := logCount(t, q, "backend healthy", nil, 1); n != 1 {
		t.Errorf("%d 'backend healthy' lines after Redis started, want 1\n%s", n, q.Logs())
	}
}
