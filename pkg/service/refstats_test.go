package service_test

import (
	"context"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

const refStatsConfig = `
domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: svc
    value: api
    descriptors:
      - key: method
        value: GET
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
`

// statsdSink is a UDP listener that records every stat line it receives.
type statsdSink struct{ *testproc.StatsdSink }

func newStatsdSink(t testing.TB) statsdSink { return statsdSink{testproc.ListenStatsd(t)} }

// waitDatagrams waits until n datagrams in all have arrived (loopback
// delivers them in well under the time allowed).
func (s statsdSink) waitDatagrams(t testing.TB, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := s.Datagrams()
		if uint64(got) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d datagrams, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// totals sums the values of every line by "name|type" (counters and
// gauges by value; timers counted as samples); a malformed line fails t.
func (s statsdSink) totals(t testing.TB) map[string]float64 {
	t.Helper()
	totals, bad := s.Totals()
	if len(bad) > 0 {
		t.Fatalf("malformed statsd lines %q", bad)
	}
	return totals
}

// refEnv is a service with a statsd client behind a real loopback gRPC
// server with the statsd interceptor, as cmd/ratelimitd wires it.
type refEnv struct {
	svc    *service.Service
	sc     *statsd.Client
	sink   statsdSink
	reg    *prometheus.Registry
	clock  *clock
	client rlsv3.RateLimitServiceClient
}

func startRefEnv(t *testing.T, store service.Store, mutate func(*service.Options)) *refEnv {
	t.Helper()
	c := &clock{now: t0}
	if store == nil {
		store = newStore(t, c)
	}
	e := &refEnv{clock: c, sink: newStatsdSink(t), reg: prometheus.NewRegistry()}
	sc, err := statsd.New(statsd.Options{Addr: e.sink.Addr(), FlushInterval: time.Hour, Registerer: e.reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	e.sc = sc
	opts := testOptions(c, store, e.reg)
	opts.Statsd = sc
	svc := newService(t, opts, mutate)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rl.yaml"), refStatsConfig)
	set, _, err := policy.Load(policy.LoadOptions{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(set)
	svc.CountReload(service.ReloadSuccess, set)
	e.svc = svc

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(svc.ServerOption(), grpc.ChainUnaryInterceptor(svc.UnaryServerInterceptor()))
	svc.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
	})
	e.client = rlsv3.NewRateLimitServiceClient(conn)
	return e
}

func (e *refEnv) call(t *testing.T, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := e.client.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// flush sends everything and waits for it; it returns the totals
// received so far.
func (e *refEnv) flush(t *testing.T) map[string]float64 {
	t.Helper()
	e.sc.Flush()
	e.sink.waitDatagrams(t, datagrams(t, e.reg))
	return e.sink.totals(t)
}

func datagrams(t *testing.T, g prometheus.Gatherer) uint64 {
	t.Helper()
	return uint64(gatherValue(t, g, "ratelimitd_statsd_datagrams_total", nil))
}

// gatherValue is the sum of the series of name in g whose labels include
// want (0 when absent).
func gatherValue(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	v, err := testproc.MetricSum(g, name, want)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func checkStats(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// The hit stats of envoyproxy/ratelimit, with hits_addend, from real gRPC
// calls: within_limit, near_limit (the part of the hits above
// floor(10 × 0.8) = 8), over_limit (the part above 10), total_hits.
func TestStatsdHitStats(t *testing.T) {
	e := startRefEnv(t, nil, nil)
	type step struct {
		hits uint64
		code rlsv3.RateLimitResponse_Code
	}
	for i, s := range []step{
		{5, rlsv3.RateLimitResponse_OK},         // used 0 → 5: within 5
		{4, rlsv3.RateLimitResponse_OK},         // 5 → 9: within 4, near 1
		{3, rlsv3.RateLimitResponse_OVER_LIMIT}, // 9 (+3 = 12, consumes nothing): over 2, near 1
		{1, rlsv3.RateLimitResponse_OK},         // 9 → 10: within 1, near 1
		{2, rlsv3.RateLimitResponse_OVER_LIMIT}, // 10 (+2): over 2
	} {
		if got := e.call(t, req("rl", withHits(d("user", "u1"), s.hits))).GetOverallCode(); got != s.code {
			t.Fatalf("step %d: code %v, want %v", i, got, s.code)
		}
	}
	// Shadow mode (limit 2, near threshold floor(1.6) = 1): the third
	// request would be denied and is answered OK.
	for i := range 3 {
		if got := e.call(t, req("rl", d("shadow", "s"))).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow call %d: %v", i, got)
		}
	}
	// A nested shadow rule, with a request-level hits_addend of 3.
	r := req("rl", d("svc", "api", "method", "GET"))
	r.HitsAddend = 3
	e.call(t, r)
	// An unknown domain: one domain_not_found per descriptor.
	e.call(t, req("nope", d("a", "1"), d("b", "2")))

	got := e.flush(t)
	p := "ratelimit.service.rate_limit."
	checkStats(t, got, map[string]float64{
		p + "rl.user.total_hits|c":   15,
		p + "rl.user.within_limit|c": 10,
		p + "rl.user.near_limit|c":   3,
		p + "rl.user.over_limit|c":   4,

		p + "rl.shadow.total_hits|c":   3,
		p + "rl.shadow.within_limit|c": 2,
		p + "rl.shadow.near_limit|c":   1,
		p + "rl.shadow.over_limit|c":   1,
		p + "rl.shadow.shadow_mode|c":  1,

		p + "rl.svc_api.method_GET.total_hits|c":  3,
		p + "rl.svc_api.method_GET.over_limit|c":  2, // 0 (+3) over 1
		p + "rl.svc_api.method_GET.near_limit|c":  1, // between max(0, 0) and 1
		p + "rl.svc_api.method_GET.shadow_mode|c": 2,

		p + "nope.domain_not_found|c": 2,

		"ratelimit.service.config_load_success|c":           1,
		"ratelimit_server.ShouldRateLimit.total_requests|c": 10,
		"ratelimit_server.ShouldRateLimit.response_time|ms": 10,
	})
	for _, k := range []string{p + "rl.user.shadow_mode|c", p + "rl.svc_api.method_GET.within_limit|c", "ratelimit.service.config_load_error|c"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s sent, want nothing (no change)", k)
		}
	}
	// The same points counted the Prometheus decisions (hits_addend 1 on
	// the shadow rule: one decision per hit).
	dec := func(rule, result string) float64 {
		return gatherValue(t, e.reg, "ratelimitd_decisions_total", map[string]string{"domain": "rl", "rule": rule, "result": result})
	}
	if ok, near, sh := dec("rl.shadow", "ok"), dec("rl.shadow", "near_limit"), dec("rl.shadow", "shadow"); ok+near != got[p+"rl.shadow.within_limit|c"] || near != got[p+"rl.shadow.near_limit|c"] || sh != got[p+"rl.shadow.shadow_mode|c"] {
		t.Errorf("Prometheus ok %v near_limit %v shadow %v vs statsd %v", ok, near, sh, got)
	}

	// Counters are sent as their change since the previous flush.
	e.call(t, req("rl", d("user", "u1")))
	before := got[p+"rl.user.total_hits|c"]
	got = e.flush(t)
	if got[p+"rl.user.total_hits|c"] != before+1 || got[p+"rl.user.over_limit|c"] != 5 {
		t.Errorf("after one more denied hit: total %v over %v, want %v and 5", got[p+"rl.user.total_hits|c"], got[p+"rl.user.over_limit|c"], before+1)
	}
}

// detailed_metric and value_to_metric stat keys carry request values,
// bounded by DetailedMetricCap for the process's life; IPv4 dots become '_'
// as in envoyproxy/ratelimit's SanitizeStatName.
func TestStatsdRequestValueKeys(t *testing.T) {
	e := startRefEnv(t, nil, func(o *service.Options) { o.DetailedMetricCap = 2 })
	for _, v := range []string{"10.0.0.1", "b", "c", "b"} {
		e.call(t, req("rl", d("client", v)))
	}
	for _, v := range []string{"x", "y", "z"} {
		e.call(t, req("rl", d("tenant", v)))
	}
	e.call(t, req("nope", d("a", "1"), d("b", "2")))
	if _, err := e.client.ShouldRateLimit(context.Background(), req("", d("a", "1"))); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty domain: %v, want InvalidArgument", err)
	}
	got := e.flush(t)
	p := "ratelimit.service.rate_limit."
	checkStats(t, got, map[string]float64{
		p + "rl.client_10_0_0_1.total_hits|c":                      1,
		p + "rl.client_b.total_hits|c":                             2,
		p + "rl._other.total_hits|c":                               1, // "c": past the cap (Prometheus rule="_other")
		p + "rl.tenant_x.total_hits|c":                             1,
		p + "rl.tenant_y.total_hits|c":                             1,
		p + "rl.tenant.total_hits|c":                               1, // "z": past the cap, the config key
		p + "_unknown.domain_not_found|c":                          2, // one per descriptor; "nope" is past the cap
		"ratelimit.service.call.should_rate_limit.service_error|c": 1,
	})
	if dec := gatherValue(t, e.reg, "ratelimitd_decisions_total", map[string]string{"rule": service.LabelOther}); dec != 1 {
		t.Errorf("Prometheus _other decisions %v, want 1", dec)
	}
	// A new config does not grant the budget again: "c" stays past the cap.
	e.svc.SetPolicy(e.svc.Policy())
	e.call(t, req("rl", d("client", "c")))
	if got := e.flush(t); got[p+"rl.client_c.total_hits|c"] != 0 || got[p+"rl._other.total_hits|c"] != 2 {
		t.Errorf("after SetPolicy: rl.client_c.total_hits = %v, rl._other.total_hits = %v, want 0 and 2", got[p+"rl.client_c.total_hits|c"], got[p+"rl._other.total_hits|c"])
	}
	if dec := gatherValue(t, e.reg, "ratelimitd_decisions_total", map[string]string{"rule": service.LabelOther}); dec != 2 {
		t.Errorf("after SetPolicy: Prometheus _other decisions %v, want 2", dec)
	}
}

// A backend failure counts redis_error once per request; failure_mode open
// admits the hits (within_limit). Global shadow mode counts
// global_shadow_mode. Config loads count config_load_success/error.
func TestStatsdServiceStats(t *testing.T) {
	e := startRefEnv(t, newReferenceStore(&clock{now: t0}).failing(errDown), nil)
	e.call(t, req("rl", withHits(d("user", "u"), 4), d("tenant", "t")))
	e.svc.CountReload(service.ReloadFailure, nil)
	e.svc.CountReload(service.ReloadReadError, nil)
	e.svc.CountReload(service.ReloadUnchanged, nil)
	e.svc.CountReload(service.ReloadWatchError, nil)
	got := e.flush(t)
	p := "ratelimit.service.rate_limit."
	checkStats(t, got, map[string]float64{
		"ratelimit.service.call.should_rate_limit.redis_error|c": 1,
		p + "rl.user.total_hits|c":                               4,
		p + "rl.user.within_limit|c":                             4,
		p + "rl.tenant_t.within_limit|c":                         1,
		"ratelimit.service.config_load_success|c":                2, // startup, unchanged
		"ratelimit.service.config_load_error|c":                  2, // failure, read_error
	})

	g := startRefEnv(t, nil, func(o *service.Options) { o.ShadowMode = true })
	for range 2 {
		g.call(t, req("rl", d("svc", "api", "method", "GET")))
	}
	got = g.flush(t)
	checkStats(t, got, map[string]float64{
		"ratelimit.service.global_shadow_mode|c":            0, // the rule is shadow_mode itself: never denies
		p + "rl.svc_api.method_GET.shadow_mode|c":           1,
		"ratelimit_server.ShouldRateLimit.total_requests|c": 2,
	})
	for range 11 {
		g.call(t, req("rl", d("user", "g")))
	}
	got = g.flush(t)
	checkStats(t, got, map[string]float64{
		"ratelimit.service.global_shadow_mode|c": 1,
		p + "rl.user.over_limit|c":               1,
		p + "rl.user.within_limit|c":             10,
	})
}

// The Prometheus statsd exporter mapping that Envoy Gateway deploys next
// to envoyproxy/ratelimit: glob patterns, first match wins, "*" one
// dot-separated component; anything else is dropped.
var envoyGatewayMappings = []struct{ match, name string }{
	{"ratelimit.service.rate_limit.*.*.near_limit", "ratelimit_service_rate_limit_near_limit"},
	{"ratelimit.service.rate_limit.*.*.over_limit", "ratelimit_service_rate_limit_over_limit"},
	{"ratelimit.service.rate_limit.*.*.total_hits", "ratelimit_service_rate_limit_total_hits"},
	{"ratelimit.service.rate_limit.*.*.within_limit", "ratelimit_service_rate_limit_within_limit"},
	{"ratelimit.service.rate_limit.*.*.*.near_limit", "ratelimit_service_rate_limit_near_limit"},
	{"ratelimit.service.rate_limit.*.*.*.over_limit", "ratelimit_service_rate_limit_over_limit"},
	{"ratelimit.service.rate_limit.*.*.*.total_hits", "ratelimit_service_rate_limit_total_hits"},
	{"ratelimit.service.rate_limit.*.*.*.within_limit", "ratelimit_service_rate_limit_within_limit"},
	{"ratelimit.service.call.should_rate_limit.*", "ratelimit_service_should_rate_limit_error"},
	{"ratelimit_server.*.total_requests", "ratelimit_service_total_requests"},
	{"ratelimit_server.*.response_time", "ratelimit_service_response_time_seconds"},
	{"ratelimit.service.config_load_success", "ratelimit_service_config_load_success"},
	{"ratelimit.service.config_load_error", "ratelimit_service_config_load_error"},
	{"ratelimit.service.rate_limit.*.*.*.shadow_mode", "ratelimit_service_rate_limit_shadow_mode"},
}

func envoyGatewayMetric(name string) string {
	for _, m := range envoyGatewayMappings {
		re := "^" + strings.ReplaceAll(regexp.QuoteMeta(m.match), `\*`, `[^.]+`) + "$"
		if regexp.MustCompile(re).MatchString(name) {
			return m.name
		}
	}
	return ""
}

func TestStatsdNamesMatchEnvoyGatewayMapping(t *testing.T) {
	e := startRefEnv(t, nil, nil)
	for range 12 {
		e.call(t, req("rl", d("user", "u")))
		e.call(t, req("rl", d("svc", "api", "method", "GET")))
	}
	e.svc.CountReload(service.ReloadFailure, nil)
	if _, err := e.client.ShouldRateLimit(context.Background(), req("", d("a", "1"))); err == nil {
		t.Fatal("empty domain accepted")
	}
	got := e.flush(t)
	for _, name := range []string{
		"ratelimit.service.rate_limit.rl.user.total_hits",
		"ratelimit.service.rate_limit.rl.user.within_limit",
		"ratelimit.service.rate_limit.rl.user.near_limit",
		"ratelimit.service.rate_limit.rl.user.over_limit",
		"ratelimit.service.rate_limit.rl.svc_api.method_GET.total_hits",
		"ratelimit.service.rate_limit.rl.svc_api.method_GET.over_limit",
		"ratelimit.service.rate_limit.rl.svc_api.method_GET.shadow_mode",
		"ratelimit.service.call.should_rate_limit.service_error",
		"ratelimit_server.ShouldRateLimit.total_requests",
		"ratelimit_server.ShouldRateLimit.response_time",
		"ratelimit.service.config_load_success",
		"ratelimit.service.config_load_error",
	} {
		sent := false
		for k := range got {
			if strings.HasPrefix(k, name+"|") {
				sent = true
			}
		}
		if !sent {
			t.Errorf("%s not sent", name)
		}
		if envoyGatewayMetric(name) == "" {
			t.Errorf("%s is dropped by Envoy Gateway's statsd exporter mapping", name)
		}
	}
	if m := envoyGatewayMetric("ratelimit.service.rate_limit.rl.user.total_hits"); m != "ratelimit_service_rate_limit_total_hits" {
		t.Errorf("mapped to %q", m)
	}
}
