package e2e

import (
	"fmt"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// Two ratelimitd replicas on one real redis-server share their counters:
// one through --redis-url, the other through envoyproxy/ratelimit's
// REDIS_URL/REDIS_SOCKET_TYPE (which also select the Redis backend).
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
