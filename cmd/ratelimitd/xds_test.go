package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds/xdstest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// xdsEnv is a server whose config comes from a real go-control-plane ADS
// server over mutual TLS, wired as serve wires it: the reference's
// variables through serveopts.Parse and serveopts.XDSOptions, xds.Run handing loads to
// the same apply and fail as the file watcher, the RLS and health
// services on a loopback gRPC server.
type xdsEnv struct {
	srv    *xdstest.Server
	s      *server
	reg    *prometheus.Registry
	rls    rlsv3.RateLimitServiceClient
	health healthpb.HealthClient
}

func newXDSEnv(t *testing.T) *xdsEnv {
	t.Helper()
	e := &xdsEnv{srv: xdstest.Start(t, xdstest.NewCerts(t)), reg: prometheus.NewRegistry()}
	o, _, err := serveopts.Parse(nil, env(append(splitEnv(e.srv.ClientEnv()),
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "50ms",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "50ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "200ms")...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	mem := memoryStore(t)
	svc := newTestService(t, service.Options{Store: mem, Registerer: e.reg})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e.s = &server{opts: o, log: log, svc: svc, store: mem, health: health.NewServer()}
	e.s.warm.Store(true)
	e.s.updateHealth()
	cc := dialBounds(t, boundsServer(t, o, svc, e.s.health))
	e.rls = rlsv3.NewRateLimitServiceClient(cc)
	e.health = healthpb.NewHealthClient(cc)

	xo, err := serveopts.XDSOptions(o, log, policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- xds.Run(ctx, xo, e.s.apply, e.s.fail) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("xds.Run returned %v", err)
		}
	})
	return e
}

// splitEnv turns NAME=value entries into env's name, value pairs.
func splitEnv(kvs []string) []string {
	var out []string
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out = append(out, k, v)
	}
	return out
}

func (e *xdsEnv) reloads(t *testing.T) map[string]float64 {
	t.Helper()
	return (&reloadEnv{reg: e.reg}).reloads(t)
}

func (e *xdsEnv) waitReloads(t *testing.T, result string, n float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for e.reloads(t)[result] < n {
		if time.Now().After(deadline) {
			t.Fatalf("reloads{result=%q} never reached %v: %v", result, n, e.reloads(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *xdsEnv) serving(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	r, err := e.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: rlsServiceName})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetStatus()
}

// call sends one ShouldRateLimit as Envoy does for one route rate limit:
// one descriptor of entries (key, value pairs), hits_addend when > 0.
func (e *xdsEnv) call(t *testing.T, domain string, hits uint64, kv ...string) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	if hits > 0 {
		d.HitsAddend = wrapperspb.UInt64(hits)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatuses()[0]
}

func callCodes(t *testing.T, e *xdsEnv, n int, domain string, hits uint64, kv ...string) string {
	t.Helper()
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, e.call(t, domain, hits, kv...).GetCode().String())
	}
	return strings.Join(out, " ")
}

// TestXDSConfigDecisions: serve with an xDS config source is NOT_SERVING
// until the first snapshot, then decides the snapshot's rules (per-user
// limits, hits_addend).
func TestXDSConfigDecisions(t *testing.T) {
	e := newXDSEnv(t)
	route := []string{xdstest.EGRoute, xdstest.EGRoute}
	user := func(id string) []string { return append(append([]string{}, route...), "rule-0-match-0", id) }

	// No snapshot yet: listeners up, health NOT_SERVING, no config.
	if st := e.serving(t); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before any config: %v", st)
	}
	v1 := e.srv.Set(xdstest.NodeID, xdstest.EGConfigs(2)...)
	e.waitReloads(t, "success", 1)
	if _, err := e.srv.WaitRequest(20*time.Second, xdstest.IsACK(v1)); err != nil {
		t.Fatal(err)
	}
	if st := e.serving(t); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health after the first config: %v", st)
	}

	// rule 0, x-user-id distinct: 2 per hour per user.
	if got := callCodes(t, e, 3, xdstest.EGDomain, 0, user("alice")...); got != "OK OK OVER_LIMIT" {
		t.Errorf("alice: %s", got)
	}
	if got := callCodes(t, e, 1, xdstest.EGDomain, 0, user("bob")...); got != "OK" {
		t.Errorf("bob: %s", got)
	}
	// rule 1, request cost 2 (hits_addend): 4 per hour.
	rule1 := append(append([]string{}, route...), "rule-1-match-0", "rule-1-match-0")
	if got := callCodes(t, e, 3, xdstest.EGDomain, 2, rule1...); got != "OK OK OVER_LIMIT" {
		t.Errorf("request cost 2 against 4/hour: %s", got)
	}
	// rule 2, masked_remote_address + remote_address: 6 per minute per IP;
	// response cost: Envoy's second call at stream done (apply_on_stream_done)
	// carries the response's cost, 4, on the same descriptor.
	ip := func(a string) []string {
		return append(append([]string{}, route...), "masked_remote_address", "10.0.0.0/8", "remote_address", a)
	}
	if got := callCodes(t, e, 1, xdstest.EGDomain, 0, ip("10.1.2.3")...); got != "OK" {
		t.Errorf("request: %s", got)
	}
	if got := callCodes(t, e, 1, xdstest.EGDomain, 4, ip("10.1.2.3")...); got != "OK" {
		t.Errorf("response cost 4: %s", got)
	}
	if got := callCodes(t, e, 2, xdstest.EGDomain, 0, ip("10.1.2.3")...); got != "OK OVER_LIMIT" {
		t.Errorf("after 5 of 6: %s", got)
	}
	if got := callCodes(t, e, 1, xdstest.EGDomain, 0, ip("10.9.9.9")...); got != "OK" {
		t.Errorf("another IP: %s", got)
	}
	// Shared limit: its own domain, 8 per day per user, across routes.
	shared := []string{xdstest.EGSharedName, xdstest.EGSharedNS, "rule-0-match-0", "alice"}
	if got := callCodes(t, e, 1, xdstest.EGShared, 8, shared...); got != "OK" {
		t.Errorf("shared: %s", got)
	}
	if got := callCodes(t, e, 1, xdstest.EGShared, 0, shared...); got != "OVER_LIMIT" {
		t.Errorf("shared after 8 of 8: %s", got)
	}

	// Update: the new limit is in force (alice's 2 hits stay counted).
	v2 := e.srv.Set(xdstest.NodeID, xdstest.EGConfigs(10)...)
	e.waitReloads(t, "success", 2)
	if _, err := e.srv.WaitRequest(20*time.Second, xdstest.IsACK(v2)); err != nil {
		t.Fatal(err)
	}
	st := e.call(t, xdstest.EGDomain, 0, user("alice")...)
	if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit().GetRequestsPerUnit() != 10 || st.GetLimitRemaining() != 7 {
		t.Errorf("after the update: %v limit %d remaining %d, want OK 10 7", st.GetCode(), st.GetCurrentLimit().GetRequestsPerUnit(), st.GetLimitRemaining())
	}

	// Invalid snapshot: NACKed, counted as a failure, the config in force
	// kept.
	bad := xdstest.EGConfigs(50)
	bad[0].Descriptors[0].Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	v3 := e.srv.Set(xdstest.NodeID, bad...)
	nack, err := e.srv.WaitRequest(20*time.Second, xdstest.IsNACK(v2))
	if err != nil {
		t.Fatalf("no NACK of %s: %v", v3, err)
	}
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "unit is required") {
		t.Errorf("NACK detail %q", msg)
	}
	e.waitReloads(t, "failure", 1)
	st = e.call(t, xdstest.EGDomain, 0, user("alice")...)
	if st.GetCurrentLimit().GetRequestsPerUnit() != 10 || st.GetLimitRemaining() != 6 {
		t.Errorf("after the NACK: limit %d remaining %d, want 10 6", st.GetCurrentLimit().GetRequestsPerUnit(), st.GetLimitRemaining())
	}
	if got := e.reloads(t); got["success"] != 2 || got["failure"] != 1 {
		t.Errorf("reloads %v, want success 2, failure 1", got)
	}
	if st := e.serving(t); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health after a NACK: %v", st)
	}
}
