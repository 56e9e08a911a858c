package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// metricValue returns the value of the counter, gauge or histogram
// (sample count) name{labels} in reg (exactly those labels), 0 when absent.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	v, err := testproc.MetricValue(reg, name, labels)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestFailureModes(t *testing.T) {
	type want struct {
		overall    string
		problem    string // problem type suffix on OVER_LIMIT
		result     string // decisions_total result
		rateLimit  bool   // RateLimit header present
		retryAfter string
	}
	for _, tc := range []struct {
		name        string
		key         string
		noFallback  bool
		fallbackErr bool
		calls       int
		want        want
	}{
		{"open allows", "open", false, false, 1, want{"OK", "", "failed_open", false, ""}},
		{"closed denies", "closed", false, false, 1, want{"OVER_LIMIT", "temporary-reduced-capacity", "failed_closed", true, "1"}},
		{"local decides with the fallback", "local", false, false, 1, want{"OK", "", "near_limit", true, ""}}, // 1 per minute: the first use is past 0.8
		{"local fallback denies", "local", false, false, 2, want{"OVER_LIMIT", "quota-exceeded", "over_limit", true, "30"}},
		{"local without fallback is open", "local", true, false, 1, want{"OK", "", "failed_open", false, ""}},
		{"local with failing fallback is open", "local", false, true, 1, want{"OK", "", "failed_open", false, ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *service.Options) {
				if tc.noFallback {
					o.Fallback = nil
				}
			})
			e.store.fail(errDown)
			if tc.fallbackErr {
				e.fallback.fail(causeErr{"oom"})
			}
			var resp = e.call(t, req("svc", d(tc.key, "k")))
			for i := 1; i < tc.calls; i++ {
				resp = e.call(t, req("svc", d(tc.key, "k")))
			}
			if got := resp.GetOverallCode().String(); got != tc.want.overall {
				t.Errorf("overall %s, want %s", got, tc.want.overall)
			}
			h := headers(t, resp)
			if _, ok := h["RateLimit"]; ok != tc.want.rateLimit {
				t.Errorf("RateLimit header present=%v, want %v (%v)", ok, tc.want.rateLimit, h)
			}
			if h["RateLimit-Policy"] == "" {
				t.Errorf("RateLimit-Policy missing: %v", h)
			}
			if h["Retry-After"] != tc.want.retryAfter {
				t.Errorf("Retry-After %q, want %q", h["Retry-After"], tc.want.retryAfter)
			}
			if tc.want.problem != "" {
				var p service.Problem
				if err := json.Unmarshal(resp.GetRawBody(), &p); err != nil {
					t.Fatal(err)
				}
				if p.Type != service.DefaultProblemTypeBase+tc.want.problem || p.Status != 429 {
					t.Errorf("problem %+v", p)
				}
			}
			if v := metricValue(t, e.reg, "ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": "svc." + tc.key, "result": tc.want.result}); v != 1 {
				t.Errorf("decisions{result=%s} = %v, want 1", tc.want.result, v)
			}
			if v := metricValue(t, e.reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "refused"}); v != float64(tc.calls) {
				t.Errorf("backend_errors{refused} = %v, want %d", v, tc.calls)
			}
			if tc.fallbackErr || tc.noFallback {
				if v := metricValue(t, e.reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "fallback"}); v != 1 {
					t.Errorf("backend_errors{fallback} = %v, want 1", v)
				}
			}
		})
	}
}

func TestFailureModesMixed(t *testing.T) {
	e := newEnv(t, nil)
	e.store.fail(errDown)
	resp := e.call(t, req("svc", d("open", "k"), d("closed", "k")))
	if resp.GetOverallCode() != OVER {
		t.Fatalf("open + closed: %v", resp.GetOverallCode())
	}
	if c := resp.GetStatuses()[0].GetCode(); c != OK {
		t.Errorf("open status %v", c)
	}
	var p service.Problem
	_ = json.Unmarshal(resp.GetRawBody(), &p)
	if len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "closed" {
		t.Errorf("violated %v", p.ViolatedPolicies)
	}
	// Backend back: normal answers resume.
	e.store.fail(nil)
	if resp := e.call(t, req("svc", d("closed", "k"))); resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetLimitRemaining() != 4 {
		t.Errorf("after recovery: %v", resp)
	}
}

// blockingStore waits for the context to end; it sends the deadline it
// was given (zero: none) on deadlines.
type blockingStore struct{ deadlines chan time.Time }

func (s blockingStore) Take(ctx context.Context, _ []algo.Hit, _ []algo.Decision) error {
	d, _ := ctx.Deadline()
	s.deadlines <- d
	<-ctx.Done()
	return ctx.Err()
}

func TestStoreGetsRequestDeadline(t *testing.T) {
	reg := prometheus.NewRegistry()
	store := blockingStore{deadlines: make(chan time.Time, 1)}
	svc, err := service.New(service.Options{Store: store, Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(loadSet(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	callerDeadline, _ := ctx.Deadline()
	// Not decided in time, nothing proves the backend failed: a request
	// only failure_mode open would admit is DeadlineExceeded (the caller's
	// own failure policy decides), never admitted uncounted.
	resp, err := svc.ShouldRateLimit(ctx, req("svc", d("open", "k")))
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("resp %v err %v, want DeadlineExceeded", resp, err)
	}
	// The Store was given the request's deadline (or an earlier one), so
	// it returns when the caller stops waiting.
	if got := <-store.deadlines; got.IsZero() || got.After(callerDeadline) {
		t.Errorf("Store.Take got deadline %v, want one no later than the request's %v", got, callerDeadline)
	}
	if v := metricValue(t, reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "timeout"}); v != 1 {
		t.Errorf("backend_errors{timeout} = %v", v)
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, func(o *service.Options) { o.DetailedMetricCap = 2 })
	for i := 0; i < 11; i++ {
		e.call(t, req("svc", d("user", "u")))
	}
	e.call(t, req("nosuch", d("user", "u")))
	e.call(t, req("nosuch2", d("user", "u")))
	for _, v := range []string{"a", "b", "c", "d"} {
		e.call(t, req("svc", d("detailed", v)))
	}
	e.call(t, req("svc", d("shadowed", "s")))
	e.call(t, req("svc", d("shadowed", "s")))
	_, _ = e.svc.ShouldRateLimit(context.Background(), req("svc"))
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ratelimitd_requests_total", map[string]string{"domain": "svc", "code": "ok"}, 10 + 4 + 2},
		{"ratelimitd_requests_total", map[string]string{"domain": "svc", "code": "over_limit"}, 1},
		{"ratelimitd_requests_total", map[string]string{"domain": "svc", "code": "invalid_argument"}, 1},
		{"ratelimitd_requests_total", map[string]string{"domain": "_unknown", "code": "ok"}, 2},
		{"ratelimitd_unknown_domain_requests_total", nil, 2},
		// 10 per minute, near-limit ratio 0.8: calls 9 and 10 are near.
		{"ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": "svc.user", "result": "ok"}, 8},
		{"ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": "svc.user", "result": "near_limit"}, 2},
		{"ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": "svc.user", "result": "over_limit"}, 1},
		{"ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": "_other", "result": "ok"}, 2},
		{"ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": "svc.shadowed", "result": "shadow"}, 1},
		{"ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": "svc.shadowed", "result": "near_limit"}, 1},
		{"ratelimitd_request_duration_seconds", nil, 20},
		{"ratelimitd_inflight_requests", nil, 0},
	} {
		if got := metricValue(t, e.reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Two detailed labels under the cap, never a raw value beyond it.
	mfs, _ := e.reg.Gather()
	detailed := 0
	for _, mf := range mfs {
		if mf.GetName() != "ratelimitd_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "rule" && lp.GetValue() != "_other" && lp.GetValue() != "svc.user" && lp.GetValue() != "svc.shadowed" {
					detailed++
				}
			}
		}
	}
	if detailed != 2 {
		t.Errorf("%d detailed rule labels, want the cap 2", detailed)
	}

	set := e.svc.Policy()
	e.svc.ObserveReload(true, set)
	e.svc.ObserveReload(false, nil)
	if v := metricValue(t, e.reg, "ratelimitd_config_reloads_total", map[string]string{"result": "success"}); v != 1 {
		t.Errorf("reloads success %v", v)
	}
	if v := metricValue(t, e.reg, "ratelimitd_config_reloads_total", map[string]string{"result": "failure"}); v != 1 {
		t.Errorf("reloads failure %v", v)
	}
	if v := metricValue(t, e.reg, "ratelimitd_config_info", map[string]string{"hash": set.Hash()}); v != 1 || set.Hash() == "" {
		t.Errorf("config_info{hash=%q} = %v", set.Hash(), v)
	}
}

func TestNewRejectsDoubleRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := newReferenceStore(&clock{now: t0})
	if _, err := service.New(service.Options{Store: st, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := service.New(service.Options{Store: st, Registerer: reg}); err == nil {
		t.Fatal("second registration on one registry accepted")
	}
}

func TestBackendErrorLogRateLimited(t *testing.T) {
	var buf bytes.Buffer
	e := newEnv(t, func(o *service.Options) { o.Logger = slog.New(slog.NewTextHandler(&buf, nil)) })
	e.store.fail(errDown)
	for i := 0; i < 5; i++ {
		e.call(t, req("svc", d("open", "k")))
	}
	if n := strings.Count(buf.String(), "cause=refused"); n != 1 {
		t.Fatalf("%d log lines in one second, want 1:\n%s", n, buf.String())
	}
	e.clock.Advance(time.Second)
	e.call(t, req("svc", d("open", "k")))
	if n := strings.Count(buf.String(), "suppressed=4"); n != 1 {
		t.Fatalf("second line should report 4 suppressed:\n%s", buf.String())
	}
	e.store.fail(causeErr{"oom"})
	e.call(t, req("svc", d("open", "k")))
	if n := strings.Count(buf.String(), "cause=oom"); n != 1 {
		t.Fatalf("another cause is logged on its own:\n%s", buf.String())
	}
}

// errNotDecided is a Store's "not decided within the caller's deadline
// while the backend answers" (the Redis store's ErrDeadline).
var errNotDecided = causeErr{"deadline"}

// TestUndecidedIsNotAdmitted: a request the Store could not decide in time
// (cause "deadline" or "timeout") is never admitted uncounted: with only failure_mode open rules it is DeadlineExceeded (the
// caller's own failure policy decides); a closed rule still answers
// OVER_LIMIT and a local rule its fallback's decision. It is metered as
// backend_errors{cause="deadline"} and requests{code="deadline_exceeded"}.
func TestUndecidedIsNotAdmitted(t *testing.T) {
	e := newEnv(t, nil)
	e.store.fail(errNotDecided)
	ctx := context.Background()
	if resp, err := e.svc.ShouldRateLimit(ctx, req("svc", d("open", "k"))); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("open rule, not decided: resp %v err %v, want DeadlineExceeded", resp, err)
	}
	resp, err := e.svc.ShouldRateLimit(ctx, req("svc", d("open", "k"), d("closed", "k")))
	if err != nil || resp.GetOverallCode() != OVER {
		t.Fatalf("open + closed, not decided: resp %v err %v, want OVER_LIMIT", resp, err)
	}
	for i := range 2 {
		resp, err := e.svc.ShouldRateLimit(ctx, req("svc", d("local", "k")))
		want := OK
		if i > 0 {
			want = OVER // the fallback's 1/minute
		}
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("local rule, not decided, call %d: resp %v err %v, want %v", i, resp, err, want)
		}
	}
	if v := metricValue(t, e.reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "deadline"}); v != 4 {
		t.Errorf("backend_errors{deadline} = %v, want 4", v)
	}
	if v := metricValue(t, e.reg, "ratelimitd_requests_total", map[string]string{"domain": "svc", "code": "deadline_exceeded"}); v != 1 {
		t.Errorf("requests{code=deadline_exceeded} = %v, want 1", v)
	}
	e.store.fail(nil)
	if resp := e.call(t, req("svc", d("open", "k"))); resp.GetOverallCode() != OK {
		t.Errorf("after the store answers again: %v", resp.GetOverallCode())
	}
}
