package xds_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds/xdstest"
)

// wait bounds every wait for an event; generous, so that only a missing
// event, not a slow one, fails a test.
const wait = 20 * time.Second

// recorder collects what Run hands to apply and fail.
type recorder struct {
	mu      sync.Mutex
	sets    []*policy.Set
	fails   []error
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) apply(s *policy.Set, _ []policy.Warning) {
	r.mu.Lock()
	r.sets = append(r.sets, s)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	r.fails = append(r.fails, err)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder) counts() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sets), len(r.fails)
}

// waitFor waits until ok holds for the sets and failures so far.
func (r *recorder) waitFor(t *testing.T, what string, ok func(sets []*policy.Set, fails []error) bool) {
	t.Helper()
	deadline := time.After(wait)
	for {
		r.mu.Lock()
		ch := r.changed
		done := ok(r.sets, r.fails)
		r.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// syncBuffer is the client's log (testproc.Buffer: safe for concurrent
// writes), waited on by waitFor.
type syncBuffer struct{ testproc.Buffer }

// waitFor waits until the log contains sub (at most wait).
func (s *syncBuffer) waitFor(t *testing.T, sub string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !strings.Contains(s.String(), sub) {
		if time.Now().After(deadline) {
			t.Fatalf("log never contained %q:\n%s", sub, s.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// limitOf is requests_per_unit of the limit entries match in domain, or
// -1 when nothing matches.
func limitOf(s *policy.Set, domain string, entries ...string) int64 {
	var es []policy.Entry
	for i := 0; i+1 < len(entries); i += 2 {
		es = append(es, policy.Entry{Key: entries[i], Value: entries[i+1]})
	}
	m, ok := s.Match(domain, es)
	if !ok || m.Rule == nil || len(m.Rule.Limits) == 0 {
		return -1
	}
	return int64(m.Rule.Limits[0].RequestsPerUnit)
}

func userLimit(s *policy.Set) int64 {
	return limitOf(s, xdstest.EGDomain, xdstest.EGRoute, xdstest.EGRoute, "rule-0-match-0", "alice")
}

// client runs xds.Run against srv until the test ends.
func client(t *testing.T, srv *xdstest.Server, certFile, keyFile string, mod func(*xds.Options)) (*recorder, *syncBuffer) {
	t.Helper()
	tlsFn, err := xds.ClientTLS(certFile, keyFile, srv.Certs.CA, xdstest.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	o := xds.Options{
		ServerURL:            srv.Addr,
		NodeID:               xdstest.NodeID,
		TLS:                  tlsFn,
		ConnectRetryInterval: 50 * time.Millisecond,
		BackoffInitial:       50 * time.Millisecond,
		BackoffMax:           200 * time.Millisecond,
		BackoffRandomFactor:  0.5,
		Logger:               slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&o)
	}
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- xds.Run(ctx, o, rec.apply, rec.fail) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != context.Canceled {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		case <-time.After(wait):
			t.Error("Run did not return after cancel")
		}
	})
	return rec, logs
}

func waitReq(t *testing.T, srv *xdstest.Server, what string, ok func(*discovery.DiscoveryRequest) bool) *discovery.DiscoveryRequest {
	t.Helper()
	r, err := srv.WaitRequest(wait, ok)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return r
}

// An invalid config: a limit without a unit.
func invalidConfig() *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: "bad", Domain: "bad", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 1}},
	}}
}

func TestInitialUpdateNACKKeepsConfig(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	v1 := srv.Set(xdstest.NodeID, xdstest.EGConfigs(1)...)
	rec, _ := client(t, srv, srv.Certs.ClientCert, srv.Certs.ClientKey, func(o *xds.Options) {
		o.NodeMetadata = map[string]string{"cluster": "edge", "zone": "a"}
		o.Headers = map[string]string{"x-xds-token": "secret"}
	})

	rec.waitFor(t, "the initial config", func(s []*policy.Set, _ []error) bool { return len(s) == 1 })
	waitReq(t, srv, "ACK of "+v1, xdstest.IsACK(v1))
	first := srv.Requests()[0]
	if first.GetNode().GetId() != xdstest.NodeID || first.GetTypeUrl() != xds.TypeURL || first.GetVersionInfo() != "" || len(first.GetResourceNames()) != 0 {
		t.Errorf("first request: node %q type %q version %q names %v; want node %q, type %s, no version, wildcard",
			first.GetNode().GetId(), first.GetTypeUrl(), first.GetVersionInfo(), first.GetResourceNames(), xdstest.NodeID, xds.TypeURL)
	}
	md := first.GetNode().GetMetadata().GetFields()
	if md["cluster"].GetStringValue() != "edge" || md["zone"].GetStringValue() != "a" {
		t.Errorf("node metadata = %v", md)
	}
	if h := srv.Headers(); len(h) == 0 || strings.Join(h[0].Get("x-xds-token"), ",") != "secret" {
		t.Errorf("stream metadata = %v, want x-xds-token", h)
	}
	s := rec.sets[0]
	for _, c := range []struct {
		domain  string
		entries []string
		want    int64
	}{
		{xdstest.EGDomain, []string{xdstest.EGRoute, xdstest.EGRoute, "rule-0-match-0", "alice"}, 1},
		{xdstest.EGDomain, []string{xdstest.EGRoute, xdstest.EGRoute, "rule-1-match-0", "rule-1-match-0"}, 2},
		{xdstest.EGDomain, []string{xdstest.EGRoute, xdstest.EGRoute, "masked_remote_address", "10.0.0.0/8", "remote_address", "10.1.2.3"}, 3},
		{xdstest.EGDomain, []string{xdstest.EGRoute, xdstest.EGRoute, "rule-3-match--1", "rule-3-match--1"}, 100},
		{xdstest.EGShared, []string{xdstest.EGSharedName, xdstest.EGSharedNS, "rule-0-match-0", "alice"}, 4},
		{xdstest.EGDomain, []string{xdstest.EGRoute, xdstest.EGRoute, "masked_remote_address", "192.168.0.0/16", "remote_address", "192.168.1.1"}, -1},
	} {
		if got := limitOf(s, c.domain, c.entries...); got != c.want {
			t.Errorf("%s %v: limit %d, want %d", c.domain, c.entries, got, c.want)
		}
	}

	// Update: the new limits are handed over and ACKed.
	v2 := srv.Set(xdstest.NodeID, xdstest.EGConfigs(5)...)
	rec.waitFor(t, "the updated config", func(s []*policy.Set, _ []error) bool { return len(s) == 2 })
	waitReq(t, srv, "ACK of "+v2, xdstest.IsACK(v2))
	if got := userLimit(rec.sets[1]); got != 5 {
		t.Errorf("updated limit %d, want 5", got)
	}

	// Invalid: NACKed with the validation error, the good version kept,
	// nothing applied.
	v3 := srv.Set(xdstest.NodeID, append(xdstest.EGConfigs(9), invalidConfig())...)
	rec.waitFor(t, "the rejection", func(_ []*policy.Set, f []error) bool { return len(f) == 1 })
	nack := waitReq(t, srv, "NACK of "+v3, xdstest.IsNACK(v2))
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "xds:bad:") || !strings.Contains(msg, "unit is required") {
		t.Errorf("NACK error_detail %q, want the validation error at xds:bad", msg)
	}
	if nack.GetErrorDetail().GetCode() != 3 {
		t.Errorf("NACK code %d, want 3 (INVALID_ARGUMENT)", nack.GetErrorDetail().GetCode())
	}
	if sets, _ := rec.counts(); sets != 2 {
		t.Errorf("%d configs applied after the NACK, want still 2", sets)
	}
	if !strings.Contains(rec.fails[0].Error(), "unit is required") {
		t.Errorf("fail got %v", rec.fails[0])
	}

	// A good config after the bad one is taken again.
	v4 := srv.Set(xdstest.NodeID, xdstest.EGConfigs(7)...)
	rec.waitFor(t, "the config after the NACK", func(s []*policy.Set, _ []error) bool { return len(s) == 3 })
	waitReq(t, srv, "ACK of "+v4, xdstest.IsACK(v4))
	if got := userLimit(rec.sets[2]); got != 7 {
		t.Errorf("limit after recovery %d, want 7", got)
	}
	// The snapshot cache sends a NACKed snapshot back at once; the client
	// does not load it again and its second NACK stops the loop.
	nacks := 0
	for _, r := range srv.Requests() {
		if r.GetErrorDetail() != nil {
			nacks++
		}
	}
	if _, fails := rec.counts(); nacks < 1 || nacks > 2 || fails != 1 {
		t.Errorf("%d NACKs sent and %d failures for one bad snapshot; want 1 or 2 NACKs (no loop), 1 failure", nacks, fails)
	}
}

func TestDuplicateDomainsNACKed(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	a := xdstest.EGConfigs(1)[0]
	b := xdstest.EGConfigs(2)[0]
	b.Name = "other-name-same-domain"
	v := srv.Set(xdstest.NodeID, a, b)
	rec, _ := client(t, srv, srv.Certs.ClientCert, srv.Certs.ClientKey, nil)
	rec.waitFor(t, "the rejection", func(_ []*policy.Set, f []error) bool { return len(f) == 1 })
	nack := waitReq(t, srv, "NACK of "+v, xdstest.IsNACK(""))
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "domain") {
		t.Errorf("NACK error_detail %q, want the duplicate domain", msg)
	}
	if sets, _ := rec.counts(); sets != 0 {
		t.Errorf("%d configs applied, want none", sets)
	}
}

func TestReconnectAfterServerRestart(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	v1 := srv.Set(xdstest.NodeID, xdstest.EGConfigs(1)...)
	rec, logs := client(t, srv, srv.Certs.ClientCert, srv.Certs.ClientKey, nil)
	rec.waitFor(t, "the initial config", func(s []*policy.Set, _ []error) bool { return len(s) == 1 })
	waitReq(t, srv, "ACK of "+v1, xdstest.IsACK(v1))

	srv.Stop()
	logs.waitFor(t, "stream to the management server ended")
	v2 := srv.Set(xdstest.NodeID, xdstest.EGConfigs(3)...) // changed while the server is down
	srv.Restart()
	rec.waitFor(t, "the config after the restart", func(s []*policy.Set, _ []error) bool { return len(s) == 2 })
	waitReq(t, srv, "ACK of "+v2, xdstest.IsACK(v2))
	if got := userLimit(rec.sets[1]); got != 3 {
		t.Errorf("limit after restart %d, want 3", got)
	}
	// Every stream starts without a version and names the node.
	var firsts int
	for _, r := range srv.Requests() {
		if r.GetResponseNonce() == "" {
			firsts++
			if r.GetVersionInfo() != "" || r.GetNode().GetId() != xdstest.NodeID {
				t.Errorf("first request of a stream: version %q node %q", r.GetVersionInfo(), r.GetNode().GetId())
			}
		}
	}
	if firsts != 2 {
		t.Errorf("%d streams opened, want 2", firsts)
	}
}

func TestWrongClientCertificate(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	srv.Set(xdstest.NodeID, xdstest.EGConfigs(1)...)
	rec, logs := client(t, srv, srv.Certs.RogueCert, srv.Certs.RogueKey, nil)
	logs.waitFor(t, "cannot get a stream from the management server")
	// gRPC's error is either the server's TLS alert ("remote error: tls:
	// certificate required") or a write to the closed connection; the
	// hint names the likely cause either way.
	logs.waitFor(t, "a client certificate it refuses")
	if sets, fails := rec.counts(); sets != 0 || fails != 0 {
		t.Errorf("apply %d, fail %d with a refused certificate; want neither (a connection problem is no config)", sets, fails)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("server received %d requests from a refused client", n)
	}
}

func TestUntrustedServer(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	srv.Set(xdstest.NodeID, xdstest.EGConfigs(1)...)
	other := xdstest.NewCerts(t) // a CA that did not sign the server
	tlsFn, err := xds.ClientTLS(srv.Certs.ClientCert, srv.Certs.ClientKey, other.CA, xdstest.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	rec, logs := client(t, srv, srv.Certs.ClientCert, srv.Certs.ClientKey, func(o *xds.Options) { o.TLS = tlsFn })
	logs.waitFor(t, "certificate signed by unknown authority")
	if sets, _ := rec.counts(); sets != 0 {
		t.Errorf("apply %d from an untrusted server", sets)
	}
}

func TestMaxRecvMsgSize(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	srv.Set(xdstest.NodeID, xdstest.EGConfigs(1)...)
	rec, logs := client(t, srv, srv.Certs.ClientCert, srv.Certs.ClientKey, func(o *xds.Options) { o.MaxRecvMsgSize = 64 })
	logs.waitFor(t, "larger than max")
	if sets, _ := rec.counts(); sets != 0 {
		t.Errorf("apply %d with a response over the size bound", sets)
	}
}

func TestClientTLSErrors(t *testing.T) {
	c := xdstest.NewCerts(t)
	for _, tc := range []struct {
		name          string
		cert, key, ca string
		want          string
	}{
		{"cert without key", c.ClientCert, "", "", "go together"},
		{"missing key file", c.ClientCert, c.ClientCert + ".missing", "", "client certificate"},
		{"missing CA", "", "", c.CA + ".missing", "server CA"},
		{"CA not PEM", "", "", c.ClientKey, "no PEM certificate"},
	} {
		if _, err := xds.ClientTLS(tc.cert, tc.key, tc.ca, ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
	fn, err := xds.ClientTLS(c.ClientCert, c.ClientKey, c.CA, "name")
	if err != nil {
		t.Fatal(err)
	}
	tc, err := fn()
	if err != nil {
		t.Fatal(err)
	}
	if tc.ServerName != "name" || len(tc.Certificates) != 1 || tc.RootCAs == nil || tc.MinVersion < tls.VersionTLS12 {
		t.Errorf("tls config: server name %q, %d certs, roots %v", tc.ServerName, len(tc.Certificates), tc.RootCAs != nil)
	}
}

func TestParsePairs(t *testing.T) {
	m, err := xds.ParseNodeMetadata(" cluster=edge, zone=a=b ,")
	if err != nil || len(m) != 2 || m["cluster"] != "edge" || m["zone"] != "a=b" {
		t.Errorf("ParseNodeMetadata = %v, %v", m, err)
	}
	if _, err := xds.ParseNodeMetadata("cluster:edge"); err == nil || !strings.Contains(err.Error(), "item 1") {
		t.Errorf("ParseNodeMetadata(cluster:edge) error %v", err)
	}
	h, err := xds.ParseHeaders("Authorization:Bearer x:y,x-a:1")
	if err != nil || h["authorization"] != "Bearer x:y" || h["x-a"] != "1" {
		t.Errorf("ParseHeaders = %v, %v", h, err)
	}
	if _, err := xds.ParseHeaders("a:1,secretvalue"); err == nil || strings.Contains(err.Error(), "secretvalue") || !strings.Contains(err.Error(), "item 2") {
		t.Errorf("ParseHeaders error %v: want item 2, without the value", err)
	}
	if m, err := xds.ParseHeaders(""); err != nil || m != nil {
		t.Errorf("ParseHeaders(\"\") = %v, %v", m, err)
	}
}

// A node id the server has no snapshot for: the stream opens, the server
// sees the request, and no config comes until a snapshot for that node is
// set; then it is pushed on the open stream.
func TestUnknownNodeID(t *testing.T) {
	srv := xdstest.Start(t, xdstest.NewCerts(t))
	srv.Set(xdstest.NodeID, xdstest.EGConfigs(1)...)
	rec, _ := client(t, srv, srv.Certs.ClientCert, srv.Certs.ClientKey, func(o *xds.Options) { o.NodeID = "someone-else" })
	waitReq(t, srv, "the subscription of someone-else", func(r *discovery.DiscoveryRequest) bool {
		return r.GetNode().GetId() == "someone-else" && r.GetTypeUrl() == xds.TypeURL
	})
	if sets, fails := rec.counts(); sets != 0 || fails != 0 {
		t.Errorf("apply %d, fail %d without a snapshot for the node", sets, fails)
	}
	// A snapshot for that node is pushed on the open stream.
	srv.Set("someone-else", xdstest.EGConfigs(4)...)
	rec.waitFor(t, "the config of someone-else", func(s []*policy.Set, _ []error) bool { return len(s) == 1 })
	if got := userLimit(rec.sets[0]); got != 4 {
		t.Errorf("limit %d, want 4 (someone-else's snapshot)", got)
	}
}
