package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// udpStats is a statsd server on loopback (testproc.StatsdSink).
type udpStats struct{ *testproc.StatsdSink }

func listenStatsd(t *testing.T) udpStats { return udpStats{testproc.ListenStatsd(t)} }

func (u udpStats) port() string {
	_, p, _ := net.SplitHostPort(u.Addr())
	return p
}

// get is the total of key ("name|type", see testproc.StatsdSink.Totals).
func (u udpStats) get(key string) (float64, bool) {
	totals, _ := u.Totals()
	v, ok := totals[key]
	return v, ok
}

// TestStatsdLegacyEnv: the binary with envoyproxy/ratelimit's statsd
// variables (as Envoy Gateway sets them, plus a short STATS_FLUSH_INTERVAL)
// sends the reference's stat names to STATSD_HOST:STATSD_PORT over UDP.
func TestStatsdLegacyEnv(t *testing.T) {
	u := listenStatsd(t)
	cfg := t.TempDir()
	writeFile(t, cfg, "rl.yaml", `
domain: e2e
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4}
`)
	p := start(t, startOpts{args: []string{"--config=" + cfg}, env: []string{
		"USE_STATSD=true", "STATSD_HOST=127.0.0.1", "STATSD_PORT=" + u.port(), "STATS_FLUSH_INTERVAL=100ms",
	}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	// 3 + 1 admitted (the second is near the limit: floor(4 × 0.8) = 3),
	// then 2 denied.
	for i, h := range []uint64{3, 1, 2} {
		d := desc("user", "alice")
		d.HitsAddend = wrapperspb.UInt64(h)
		resp := call(t, cc, "e2e", d)
		if want := i == 2; (resp.GetOverallCode().String() == "OVER_LIMIT") != want {
			t.Fatalf("call %d: %v", i, resp.GetOverallCode())
		}
	}
	want := map[string]float64{
		"ratelimit.service.rate_limit.e2e.user.total_hits|c":   6,
		"ratelimit.service.rate_limit.e2e.user.within_limit|c": 4,
		"ratelimit.service.rate_limit.e2e.user.near_limit|c":   1,
		"ratelimit.service.rate_limit.e2e.user.over_limit|c":   2,
		"ratelimit_server.ShouldRateLimit.total_requests|c":    3,
		"ratelimit_server.ShouldRateLimit.response_time|ms":    3,
		"ratelimit.service.config_load_success|c":              1,
	}
	eventually(t, settleWithin, func() string {
		var diffs []string
		for k, v := range want {
			if got, _ := u.get(k); got != v {
				diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", k, got, v))
			}
		}
		if _, ok := u.get("ratelimit.go.numGoroutine|g"); !ok {
			diffs = append(diffs, "no ratelimit.go.numGoroutine gauge")
		}
		return strings.Join(diffs, "; ")
	})
	if code, m := httpGet(t, "http://"+p.http+"/metrics"); code != 200 || !strings.Contains(m, "ratelimitd_statsd_datagrams_total") {
		t.Errorf("/metrics %d without ratelimitd_statsd_datagrams_total", code)
	}
	p.stop(t)
	sums, bad := u.Totals()
	if len(bad) > 0 {
		t.Errorf("malformed statsd lines: %q", bad)
	}
	// Counts are exact after the final flush at shutdown too.
	for k, v := range want {
		if sums[k] != v {
			t.Errorf("after shutdown %s = %v, want %v", k, sums[k], v)
		}
	}
}
