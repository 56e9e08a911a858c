package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds/xdstest"
)

// xdsFastRetry shortens the reference's reconnect waits for the tests.
var xdsFastRetry = []string{
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=100ms",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=100ms",
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL=500ms",
}

// metric returns the value of the sample of name with labels (exact text
// after the name, e.g. `{result="success"}`) on /metrics, or "" if absent.
func metric(t *testing.T, p *proc, name, labels string) string {
	t.Helper()
	_, body := httpGet(t, "http://"+p.http+"/metrics")
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+labels+" "); ok {
			return v
		}
	}
	return ""
}

// TestXDSReferenceEnvironment: the real binary with envoyproxy/ratelimit's
// environment as Envoy Gateway sets it (CONFIG_TYPE=GRPC_XDS_SOTW, mutual
// TLS, node envoy-ratelimit) against a go-control-plane snapshot-cache
// server: NOT_SERVING until the first config, then decisions from it;
// updates, a NACKed snapshot that keeps the config in force, and a server
// restart.
func TestXDSReferenceEnvironment(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	// Envoy Gateway always sets its Redis (REDIS_SOCKET_TYPE, REDIS_URL):
	// in reference mode, without them the backend would be the
	// reference's default, a unix socket that is not there.
	redis := redistest.Standalone(t)
	env := append(srv.ClientEnv(), xdsFastRetry...)
	env = append(env, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redis.Addr(), "REDIS_TIMEOUT=500ms")
	p := start(t, startOpts{env: env})
	cc := p.dial(t)
	user := func(id string) *rlsv3.RateLimitResponse {
		return call(t, cc, xdstest.EGDomain, desc(xdstest.EGRoute, xdstest.EGRoute, "rule-0-match-0", id))
	}

	// Listening at once, NOT_SERVING until the first config.
	if st := health(t, cc, ""); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before any config: %v", st)
	}
	if code, _ := httpGet(t, "http://"+p.http+"/healthcheck"); code != 500 {
		t.Errorf("/healthcheck before any config: %d, want 500", code)
	}

	v1 := srv.Set(xdstest.NodeID, xdstest.EGConfigs(2)...)
	p.waitServing(t, cc, "")
	p.waitServing(t, cc, "ratelimit")
	if _, err := srv.WaitRequest(20*time.Second, xdstest.IsACK(v1)); err != nil {
		t.Fatalf("%v\n%s", err, p.Logs())
	}
	var got []string
	for range 3 {
		got = append(got, user("alice").GetOverallCode().String())
	}
	if strings.Join(got, " ") != "OK OK OVER_LIMIT" {
		t.Errorf("alice under 2/hour: %v", got)
	}
	shared := call(t, cc, xdstest.EGShared, desc(xdstest.EGSharedName, xdstest.EGSharedNS, "rule-0-match-0", "alice"))
	if s := shared.GetStatuses()[0]; s.GetCode() != rlsv3.RateLimitResponse_OK || s.GetCurrentLimit().GetRequestsPerUnit() != 8 {
		t.Errorf("shared limit: %v %d, want OK 8", s.GetCode(), s.GetCurrentLimit().GetRequestsPerUnit())
	}
	if v := metric(t, p, "ratelimitd_config_reloads_total", `{result="success"}`); v != "1" {
		t.Errorf("reloads success = %q, want 1", v)
	}

	// Update.
	v2 := srv.Set(xdstest.NodeID, xdstest.EGConfigs(10)...)
	eventually(t, settleWithin, func() string {
		if l := user("bob").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); l != 10 {
			return fmt.Sprintf("limit %d after the update, want 10", l)
		}
		return ""
	})
	if _, err := srv.WaitRequest(20*time.Second, xdstest.IsACK(v2)); err != nil {
		t.Fatal(err)
	}

	// Invalid snapshot: NACKed, the config in force kept.
	bad := xdstest.EGConfigs(50)
	bad[0].Descriptors[0].Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	v3 := srv.Set(xdstest.NodeID, bad...)
	nack, err := srv.WaitRequest(20*time.Second, xdstest.IsNACK(v2))
	if err != nil {
		t.Fatalf("no NACK of %s: %v\n%s", v3, err, p.Logs())
	}
	if !strings.Contains(nack.GetErrorDetail().GetMessage(), "xds:"+xdstest.EGDomain) {
		t.Errorf("NACK detail %q does not name the resource", nack.GetErrorDetail().GetMessage())
	}
	eventually(t, settleWithin, func() string {
		if !strings.Contains(p.Logs(), "config rejected; keeping the last good config") {
			return "no rejection logged"
		}
		return ""
	})
	if l := user("carol").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); l != 10 {
		t.Errorf("limit after the NACK %d, want 10 (kept)", l)
	}
	if v := metric(t, p, "ratelimitd_config_reloads_total", `{result="failure"}`); v != "1" {
		t.Errorf("reloads failure = %q, want 1", v)
	}
	if st := health(t, cc, ""); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health after a NACK: %v", st)
	}

	// Server restart: the client reconnects and gets the config set meanwhile.
	srv.Stop()
	eventually(t, settleWithin, func() string {
		if !strings.Contains(p.Logs(), "stream to the management server ended") {
			return "stream end not logged"
		}
		return ""
	})
	v4 := srv.Set(xdstest.NodeID, xdstest.EGConfigs(20)...)
	srv.Restart()
	if _, err := srv.WaitRequest(20*time.Second, xdstest.IsACK(v4)); err != nil {
		t.Fatalf("%v\n%s", err, p.Logs())
	}
	eventually(t, settleWithin, func() string {
		if l := user("dave").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); l != 20 {
			return fmt.Sprintf("limit %d after the restart, want 20", l)
		}
		return ""
	})
	if st := health(t, cc, ""); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health after reconnect: %v", st)
	}
}

// TestXDSWrongClientCertificate: a client certificate the server does not
// trust: no config, health NOT_SERVING, and a log line that says why.
func TestXDSWrongClientCertificate(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	srv.Set(xdstest.NodeID, xdstest.EGConfigs(1)...)
	env := append(srv.ClientEnv(), xdsFastRetry...)
	env = append(env, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+srv.Certs.RogueCert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+srv.Certs.RogueKey)
	p := start(t, startOpts{env: env})
	cc := p.dial(t)
	eventually(t, settleWithin, func() string {
		logs := p.Logs()
		if !strings.Contains(logs, "cannot get a stream from the management server") || !strings.Contains(logs, "client certificate") {
			return "no connection failure with the certificate hint logged"
		}
		return ""
	})
	if st := health(t, cc, ""); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health with a refused certificate: %v", st)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("server received %d requests from a refused client", n)
	}
	if strings.Contains(p.Logs(), `"msg":"config loaded"`) {
		t.Error("a config was loaded with a refused certificate")
	}
}
