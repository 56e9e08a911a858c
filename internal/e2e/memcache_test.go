package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
)

// referenceStyleMemcache is an envoyproxy/ratelimit config as that
// project's memcache backend runs it: fixed windows, nested descriptors,
// no ratelimitd extension, plus failure modes (a ratelimitd extension) on
// two rules for the failure test.
const referenceStyleMemcache = `domain: mc
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: path
    value: /api
    descriptors:
      - key: user
        rate_limit:
          unit: hour
          requests_per_unit: 2
  - key: open
    rate_limit: {unit: hour, requests_per_unit: 100, failure_mode: open}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 100, failure_mode: closed}
  - key: local
    rate_limit: {unit: hour, requests_per_unit: 2, failure_mode: local}
`

// TestMemcacheNoRLQS: on the memcached backend, which cannot share the
// Envoys' demand among replicas, RLQS is not served: the stream fails
// with Unimplemented, so Envoy applies its no-assignment behaviour instead
// of replicas each handing out the whole remainder.
func TestMemcacheNoRLQS(t *testing.T) {
	srv := memcachetest.Start(t)
	dir := t.TempDir()
	writeFile(t, dir, "mc.yaml", referenceStyleMemcache)
	p := start(t, startOpts{args: []string{"--config", dir, "--backend=memcache", "--memcache-addrs", srv.Addr(), "--memcache-timeout=1s"}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err == nil {
		_ = stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "mc"})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("RLQS stream on memcached: %v, want Unimplemented", err)
	}
}

// TestMemcacheBackendSharedAcrossReplicas: two replicas on one real
// memcached share their counters: one set up with envoyproxy/ratelimit's
// BACKEND_TYPE=memcache MEMCACHE_HOST_PORT, the other with
// --backend=memcache --memcache-addrs.
func TestMemcacheBackendSharedAcrossReplicas(t *testing.T) {
	srv := memcachetest.Start(t)
	dir := t.TempDir()
	writeFile(t, dir, "mc.yaml", referenceStyleMemcache)
	ref := repoRoot(t) + "/examples/config-reference"
	a := start(t, startOpts{args: []string{"--config", dir, "--config", ref}, env: []string{
		"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=" + srv.Addr(), "MEMCACHE_MAX_IDLE_CONNS=4",
		"RATELIMITD_MEMCACHE_TIMEOUT=1s",
	}})
	b := start(t, startOpts{args: []string{"--config", dir, "--config", ref, "--backend=memcache", "--memcache-addrs", srv.Addr(), "--memcache-timeout=1s"}})
	ca, cb := a.dial(t), b.dial(t)
	a.waitServing(t, ca, "")
	b.waitServing(t, cb, "")
	a.waitServing(t, ca, "ratelimitd.backend")
	b.waitServing(t, cb, "ratelimitd.backend")

	conns := []*grpc.ClientConn{ca, cb, ca}
	for i, want := range []uint32{2, 1, 0} {
		resp := call(t, conns[i], "mc", desc("remote_address", "10.0.0.1"))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != want {
			t.Fatalf("call %d: %v remaining %d, want OK %d", i, resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining(), want)
		}
	}
	resp := call(t, cb, "mc", desc("remote_address", "10.0.0.1"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th call across replicas: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if d := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Minute {
		t.Errorf("duration_until_reset %v, want within the minute window", d)
	}

	// Nested descriptor, and a request whose second descriptor denies:
	// the first consumes nothing (the compensating refund).
	for i := range 2 {
		if got := call(t, ca, "mc", desc("path", "/api", "user", "alice")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("nested call %d: %v, want OK", i, got)
		}
	}
	for range 3 {
		resp := call(t, cb, "mc", desc("remote_address", "10.0.0.2"), desc("path", "/api", "user", "alice"))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("request with alice exhausted: %v, want OVER_LIMIT", resp.GetOverallCode())
		}
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 3 {
			t.Fatalf("10.0.0.2 reports %d remaining in a denied request, want 3 (nothing consumed)", got)
		}
	}
	if got := call(t, ca, "mc", desc("remote_address", "10.0.0.2")).GetStatuses()[0].GetLimitRemaining(); got != 2 {
		t.Errorf("10.0.0.2 after three denied requests: %d remaining after its first own hit, want 2", got)
	}

	// hits_addend: 2 of 3, then 2 more do not fit and consume nothing.
	addend := func(cc *grpc.ClientConn, n uint32) *rlsv3.RateLimitResponse {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "mc", HitsAddend: n, Descriptors: []*rlcommon.RateLimitDescriptor{desc("remote_address", "10.0.0.4")},
		})
		if err != nil {
			t.Fatalf("ShouldRateLimit hits_addend %d: %v", n, err)
		}
		return resp
	}
	for i, c := range []struct {
		conn *grpc.ClientConn
		code rlsv3.RateLimitResponse_Code
		rem  uint32
	}{{ca, rlsv3.RateLimitResponse_OK, 1}, {cb, rlsv3.RateLimitResponse_OVER_LIMIT, 1}, {ca, rlsv3.RateLimitResponse_OVER_LIMIT, 1}} {
		resp := addend(c.conn, 2)
		if resp.GetOverallCode() != c.code || resp.GetStatuses()[0].GetLimitRemaining() != c.rem {
			t.Fatalf("hits_addend 2, call %d: %v remaining %d, want %v %d", i, resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining(), c.code, c.rem)
		}
	}
	if resp := addend(cb, 1); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Fatalf("hits_addend 1 with 1 left: %v remaining %d, want OK 0", resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining())
	}

	// envoyproxy/ratelimit's README example (examples/config-reference):
	// the nested marketing limit, 5 per day per number, across replicas.
	for i := range 6 {
		resp := call(t, conns[i%2], "messaging", desc("message_type", "marketing", "to_number", "2061111111"))
		want := rlsv3.RateLimitResponse_OK
		if i == 5 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.GetOverallCode() != want || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 5 {
			t.Fatalf("messaging call %d: %v limit %d, want %v with 5 per day", i, resp.GetOverallCode(), resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), want)
		}
	}
	if got := call(t, cb, "messaging", desc("remote_address", "50.0.0.5")).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("requests_per_unit 0: %v, want OVER_LIMIT", got)
	}

	// Concurrent calls over both replicas admit exactly the limit.
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			if call(t, conns[i%2], "mc", desc("remote_address", "10.0.0.3")).GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if n := ok.Load(); n != 3 {
		t.Errorf("30 concurrent calls over two replicas: %d OK, want exactly 3", n)
	}
}

// TestMemcacheFailureModes: memcached killed: ratelimitd.backend turns
// NOT_SERVING, the rules' failure modes answer (open admits, closed denies,
// local counts in process) and the errors are counted with cause refused;
// after a restart it serves and counts again.
func TestMemcacheFailureModes(t *testing.T) {
	srv := memcachetest.Start(t)
	dir := t.TempDir()
	writeFile(t, dir, "mc.yaml", referenceStyleMemcache)
	p := start(t, startOpts{args: []string{"--config", dir, "--backend=memcache", "--memcache-addrs", srv.Addr(), "--memcache-timeout=1s"}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	p.waitServing(t, cc, "ratelimitd.backend")
	if got := call(t, cc, "mc", desc("closed", "x")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("closed rule with memcached up: %v, want OK", got)
	}

	srv.Kill()
	eventually(t, settleWithin, func() string {
		if got := health(t, cc, "ratelimitd.backend"); got != healthpb.HealthCheckResponse_NOT_SERVING {
			return fmt.Sprintf("ratelimitd.backend %v with memcached killed, want NOT_SERVING", got)
		}
		return ""
	})
	if got := health(t, cc, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health \"\" %v with memcached down, want SERVING (every rule has a failure mode)", got)
	}
	if got := call(t, cc, "mc", desc("open", "x")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("failure_mode open with memcached down: %v, want OK", got)
	}
	if got := call(t, cc, "mc", desc("closed", "x")).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("failure_mode closed with memcached down: %v, want OVER_LIMIT", got)
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := call(t, cc, "mc", desc("local", "x")).GetOverallCode(); got != want {
			t.Errorf("failure_mode local with memcached down, call %d: %v, want %v (2 per hour in process)", i, got, want)
		}
	}
	_, metrics := httpGet(t, "http://"+p.http+"/metrics")
	if v := metricValue(metrics, `ratelimitd_backend_errors_total{cause="refused"} `); v < 2 {
		t.Errorf("ratelimitd_backend_errors_total{cause=\"refused\"} = %v, want >= 2\n%s", v, grepLines(metrics, "backend_errors"))
	}

	srv.Restart()
	p.waitServing(t, cc, "ratelimitd.backend")
	for i, want := range []uint32{2, 1} {
		resp := call(t, cc, "mc", desc("remote_address", "10.9.9.9"))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != want {
			t.Fatalf("after restart, call %d: %v remaining %d, want OK %d", i, resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining(), want)
		}
	}
}

// TestMemcacheRefusesOtherAlgorithms: a config with an algorithm memcached
// cannot decide is refused at load, naming the rule and the backend: at
// startup the service is not SERVING; once a good config is in force a bad
// reload keeps it.
func TestMemcacheRefusesOtherAlgorithms(t *testing.T) {
	srv := memcachetest.Start(t)
	dir := t.TempDir()
	bad := "domain: mc\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: token_bucket\n"
	writeFile(t, dir, "mc.yaml", bad)
	p := start(t, startOpts{args: []string{"--config", dir, "--backend=memcached", "--memcache-addrs", srv.Addr()}})
	cc := p.dial(t)
	const refused = `descriptor \"mc.k\": algorithm token_bucket is not supported by the memcache backend (supported: fixed_window)`
	waitRefusedAtStart(t, p, cc, refused)
	if !strings.Contains(p.Logs(), "mc.yaml:7:") {
		t.Errorf("refusal does not give file:line\n%s", p.Logs())
	}
	writeFile(t, dir, "mc.yaml", "domain: mc\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	p.waitServing(t, cc, "")
	reloadRefused(t, p, cc, dir, "mc.yaml", bad, refused, "mc")
	if got := health(t, cc, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health %v after a refused reload, want SERVING on the config in force", got)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
