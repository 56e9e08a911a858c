package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

const adminConfig = `domain: login
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: ip
    shadow_mode: true
    rate_limit: {name: ip_limit, unit: minute, requests_per_unit: 1}
`

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct{ testproc.Buffer }

// lines returns the JSON log records with message msg.
func (s *syncBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.String()), "\n") {
		if l == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

type adminEnv struct {
	svc   *service.Service
	set   *policy.Set
	clock *clock
	reg   *prometheus.Registry
	log   *syncBuffer
}

// newAdminEnv is a service on adminConfig over store (nil: a memory
// store on the test clock).
func newAdminEnv(t *testing.T, store service.Store, keys policy.KeyOptions, mutate func(*service.Options)) *adminEnv {
	t.Helper()
	c := &clock{now: t0}
	if store == nil {
		m, err := memory.New(memory.Options{Now: c.Now, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		store = m
	}
	p := filepath.Join(t.TempDir(), "login.yaml")
	writeFile(t, p, adminConfig)
	set, _, err := policy.Load(policy.LoadOptions{Keys: keys}, p)
	if err != nil {
		t.Fatal(err)
	}
	e := &adminEnv{set: set, clock: c, reg: prometheus.NewRegistry(), log: &syncBuffer{}}
	opts := service.Options{Store: store, Registerer: e.reg, Now: c.Now,
		Logger: slog.New(slog.NewJSONHandler(e.log, nil))}
	e.svc = newService(t, opts, mutate)
	e.svc.SetPolicy(set)
	return e
}

func (e *adminEnv) hit(t *testing.T, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := e.svc.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (e *adminEnv) explain(t *testing.T, r *rlsv3.RateLimitRequest) *service.Explanation {
	t.Helper()
	ex, err := e.svc.Explain(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// Explain reads remaining units with check-only hits: explaining does
// not consume, and it says which limit would deny the request's cost.
func TestExplainDoesNotConsume(t *testing.T) {
	e := newAdminEnv(t, nil, policy.KeyOptions{}, nil)
	alice := req("login", d("user", "alice"))
	e.hit(t, alice)
	e.hit(t, alice)
	for range 3 {
		ex := e.explain(t, alice)
		if ex.Code != "OK" || len(ex.Denying) != 0 || len(ex.Descriptors) != 1 {
			t.Fatalf("explanation %+v", ex)
		}
		dd := ex.Descriptors[0]
		if !dd.Matched || dd.Rule != "login.user" || len(dd.Limits) != 1 || dd.WouldDeny || dd.Cost != 1 {
			t.Fatalf("descriptor %+v", dd)
		}
		l := dd.Limits[0]
		if l.Remaining != 1 || l.WouldDeny || l.RequestsPerUnit != 3 || l.Unit != "MINUTE" || l.Algorithm != "fixed_window" {
			t.Errorf("limit %+v, want remaining 1", l)
		}
		if l.ResetAfterSeconds != 30 {
			t.Errorf("reset after %v s, want 30 (t0 is 30 s into the minute)", l.ResetAfterSeconds)
		}
		if len(l.Key) != 22 || strings.Contains(l.Key, "alice") {
			t.Errorf("key %q: want the 22-byte hashed backend key", l.Key)
		}
		if strings.Join(dd.Entries, ",") != "user" {
			t.Errorf("entries %v: want keys only", dd.Entries)
		}
	}
	if r := e.hit(t, alice); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Fatalf("third hit: %v (explaining consumed)", r)
	}
	ex := e.explain(t, alice)
	if ex.Code != "OVER_LIMIT" || strings.Join(ex.Denying, ",") != "0/login.user" || !ex.Descriptors[0].Limits[0].WouldDeny {
		t.Errorf("exhausted: %+v", ex)
	}

	// The cost counts: 1 left does not admit hits_addend 2.
	bob := req("login", d("user", "bob"))
	e.hit(t, bob)
	e.hit(t, bob)
	two := req("login", withHits(d("user", "bob"), 2))
	if ex := e.explain(t, two); ex.Code != "OVER_LIMIT" || ex.Descriptors[0].Limits[0].Remaining != 1 {
		t.Errorf("cost 2 with 1 left: %+v", ex)
	}

	// A shadow descriptor's denial does not deny the request.
	ip := req("login", d("ip", "10.0.0.1"))
	e.hit(t, ip)
	ex = e.explain(t, ip)
	if ex.Code != "OK" || !ex.Descriptors[0].WouldDeny || !ex.Descriptors[0].Shadow || ex.Descriptors[0].Limits[0].Name != "ip_limit" {
		t.Errorf("shadow: %+v", ex)
	}
	// Unmatched descriptors and unknown domains are explained, not refused.
	if ex := e.explain(t, req("login", d("nope", "x"))); ex.Descriptors[0].Matched || ex.Code != "OK" {
		t.Errorf("unmatched: %+v", ex)
	}
	if _, err := e.svc.Explain(context.Background(), req("")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty domain: %v", err)
	}
	if got := metricValue(t, e.reg, "ratelimitd_admin_requests_total", map[string]string{"op": "explain", "result": "ok"}); got != 7 {
		t.Errorf("admin_requests_total{explain,ok} = %v, want 7", got)
	}
}

// Reset deletes the counters of the matched descriptors, logs who and
// the hashed key (never the value) and counts them.
func TestReset(t *testing.T) {
	e := newAdminEnv(t, nil, policy.KeyOptions{}, nil)
	alice := req("login", d("user", "alice"))
	for range 3 {
		e.hit(t, alice)
	}
	if r := e.hit(t, alice); r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fourth hit %v", r)
	}
	res, err := e.svc.Reset(context.Background(), alice, "127.0.0.1:4242")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Counters) != 1 || res.Counters[0].Rule != "login.user" || len(res.Counters[0].Key) != 22 {
		t.Fatalf("reset result %+v", res)
	}
	if r := e.hit(t, alice); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 2 {
		t.Errorf("after reset: %v", r)
	}
	lines := e.log.lines(t, "admin reset: counter deleted")
	if len(lines) != 1 || lines[0]["who"] != "127.0.0.1:4242" || lines[0]["key"] != res.Counters[0].Key || lines[0]["rule"] != "login.user" {
		t.Errorf("reset log lines %v", lines)
	}
	if strings.Contains(e.log.String(), "alice") {
		t.Errorf("the descriptor value reached the log:\n%s", e.log.String())
	}
	if got := metricValue(t, e.reg, "ratelimitd_counter_resets_total", nil); got != 1 {
		t.Errorf("counter_resets_total = %v, want 1", got)
	}

	// A store without Reset: Unimplemented; the failure_mode local
	// fallback's counters are reset all the same.
	fb, err := memory.New(memory.Options{Now: func() time.Time { return t0 }, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fb.Close() }()
	f := newAdminEnv(t, newReferenceStore(&clock{now: t0}), policy.KeyOptions{}, func(o *service.Options) { o.Fallback = fb })
	key := res.Counters[0].Key
	hit := []algo.Hit{{Key: key, Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Minute}, Cost: 3}}
	if _, err := algotest.Take(context.Background(), fb, hit); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Reset(context.Background(), alice, "x"); status.Code(err) != codes.Unimplemented {
		t.Errorf("store without Reset: %v, want Unimplemented", err)
	}
	if d, err := algotest.Take(context.Background(), fb, hit); err != nil || !d[0].Allowed {
		t.Errorf("fallback counter not reset: %+v, %v", d, err)
	}
}

// With --key-values=clear (LogValues and clear-text keys) values appear.
func TestResetLogsValuesOnlyWhenClear(t *testing.T) {
	e := newAdminEnv(t, nil, policy.KeyOptions{ClearText: true}, func(o *service.Options) { o.LogValues = true })
	if _, err := e.svc.Reset(context.Background(), req("login", d("user", "alice")), "who"); err != nil {
		t.Fatal(err)
	}
	lines := e.log.lines(t, "admin reset: counter deleted")
	if len(lines) != 1 || !strings.Contains(lines[0]["key"].(string), "alice") || !strings.Contains(e.log.String(), "user=alice") {
		t.Errorf("clear mode lines %v", lines)
	}
}

// The HTTP admin handler: explain and reset as JSON, errors as JSON.
func TestAdminHandler(t *testing.T) {
	e := newAdminEnv(t, nil, policy.KeyOptions{}, nil)
	srv := httptest.NewServer(e.svc.AdminHandler())
	defer srv.Close()
	body, _ := protojson.Marshal(req("login", d("user", "alice")))
	post := func(path string, b []byte) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: %v: %s", path, err, raw)
		}
		return resp.StatusCode, m
	}
	e.hit(t, req("login", d("user", "alice")))
	code, m := post(service.AdminExplainPath, body)
	lim := m["descriptors"].([]any)[0].(map[string]any)["limits"].([]any)[0].(map[string]any)
	if code != 200 || m["code"] != "OK" || lim["remaining"] != 2.0 {
		t.Errorf("explain: %d %v", code, m)
	}
	code, m = post(service.AdminResetPath, body)
	if code != 200 || len(m["counters"].([]any)) != 1 {
		t.Errorf("reset: %d %v", code, m)
	}
	if code, m := post(service.AdminExplainPath, []byte("{")); code != 400 || m["error"] == nil {
		t.Errorf("bad JSON: %d %v", code, m)
	}
	if code, _ := post(service.AdminExplainPath, []byte(`{"domain":""}`)); code != 400 {
		t.Errorf("invalid request: %d", code)
	}
	resp, err := http.Get(srv.URL + service.AdminResetPath)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET reset: %d", resp.StatusCode)
	}
}

// The decision log writes at most DecisionLogRate lines per second
// (capacity as much), counts the rest, and reports them in the next line.
func TestDecisionLogBound(t *testing.T) {
	e := newAdminEnv(t, nil, policy.KeyOptions{}, func(o *service.Options) {
		o.DecisionLog, o.DecisionLogRate = service.DecisionLogAll, 5
	})
	alice := req("login", d("user", "alice"))
	for range 50 {
		e.hit(t, alice)
	}
	lines := e.log.lines(t, "decision")
	if len(lines) != 5 {
		t.Fatalf("%d decision lines for 50 decisions at 5/s with a pinned clock, want 5", len(lines))
	}
	if got := metricValue(t, e.reg, "ratelimitd_decision_log_suppressed_total", nil); got != 45 {
		t.Errorf("suppressed_total = %v, want 45", got)
	}
	e.clock.Advance(200 * time.Millisecond) // one token
	e.hit(t, alice)
	e.hit(t, alice)
	lines = e.log.lines(t, "decision")
	if len(lines) != 6 || lines[5]["suppressed"] != 45.0 {
		t.Fatalf("after 200ms: %d lines, last %v", len(lines), lines[len(lines)-1])
	}
	first, last := lines[0], lines[5]
	if first["domain"] != "login" || first["code"] != "OK" || first["rules"].([]any)[0] != "login.user" ||
		first["remaining"].([]any)[0] != 2.0 || len(first["keys"].([]any)[0].(string)) != 22 {
		t.Errorf("first line %v", first)
	}
	if last["code"] != "OVER_LIMIT" || last["statuses"].([]any)[0] != "OVER_LIMIT" {
		t.Errorf("line of a denied request %v", last)
	}
	if strings.Contains(e.log.String(), "alice") || first["entries"] != nil {
		t.Errorf("values reached the log:\n%s", e.log.String())
	}
}

// --log-decisions=denied writes denied requests only (shadow denials
// included); LogValues adds the entries.
func TestDecisionLogDenied(t *testing.T) {
	e := newAdminEnv(t, nil, policy.KeyOptions{ClearText: true}, func(o *service.Options) {
		o.DecisionLog, o.LogValues = service.DecisionLogDenied, true
	})
	for range 3 {
		e.hit(t, req("login", d("user", "alice")))
	}
	if n := len(e.log.lines(t, "decision")); n != 0 {
		t.Fatalf("%d lines for allowed requests", n)
	}
	e.hit(t, req("login", d("user", "alice")))
	e.hit(t, req("login", d("ip", "10.0.0.1")))
	e.hit(t, req("login", d("ip", "10.0.0.1"))) // shadow denial
	lines := e.log.lines(t, "decision")
	if len(lines) != 2 || lines[0]["code"] != "OVER_LIMIT" || lines[1]["code"] != "OK" {
		t.Fatalf("lines %v", lines)
	}
	if lines[0]["entries"].([]any)[0] != "user=alice" {
		t.Errorf("entries %v", lines[0]["entries"])
	}
	if _, err := service.ParseDecisionLogMode("sometimes"); err == nil {
		t.Error("unknown mode accepted")
	}
}

// An explanation or a reset on a domain the config lacks is an error
// naming the domain and the loaded domains (HTTP 404, gRPC NotFound),
// never an answer that looks like "nothing limits this".
func TestAdminUnknownDomain(t *testing.T) {
	e := newAdminEnv(t, nil, policy.KeyOptions{}, nil)
	srv := httptest.NewServer(e.svc.AdminHandler())
	defer srv.Close()
	body, _ := protojson.Marshal(req("logn", d("user", "alice")))
	for _, path := range []string{service.AdminExplainPath, service.AdminResetPath} {
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var m map[string]string
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: %v: %s", path, err, raw)
		}
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(m["error"], `unknown domain "logn"`) || !strings.Contains(m["error"], `Loaded domains (1): "login"`) {
			t.Errorf("%s on an unknown domain: %d %s", path, resp.StatusCode, raw)
		}
	}
	if _, err := e.svc.Explain(context.Background(), req("logn", d("user", "alice"))); status.Code(err) != codes.NotFound {
		t.Errorf("Explain: %v, want NotFound", err)
	}
	if _, err := e.svc.Reset(context.Background(), req("logn", d("user", "alice")), "test"); status.Code(err) != codes.NotFound {
		t.Errorf("Reset: %v, want NotFound", err)
	}
	if got := metricValue(t, e.reg, "ratelimitd_admin_requests_total", map[string]string{"op": "explain", "result": "unknown_domain"}); got != 2 {
		t.Errorf("admin_requests_total{op=explain,result=unknown_domain} = %v, want 2", got)
	}
	// ShouldRateLimit itself still answers OK on an unknown domain.
	if r := e.hit(t, req("logn", d("user", "alice"))); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit on an unknown domain: %v", r.GetOverallCode())
	}
}
