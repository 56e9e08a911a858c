package service_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// partialStore denies the request's first hit and fails the others, as the
// Redis store does on a Cluster whose first hit's master is live and over
// its limit while the other hits' master is down.
type partialStore struct{}

func (partialStore) Take(_ context.Context, hits []algo.Hit, out []algo.Decision) error {
	d := out
	d[0] = algo.Decision{Allowed: false, Remaining: 0, RetryAfter: 30e9, ResetAfter: 30e9}
	var failed []int
	for i := 1; i < len(hits); i++ {
		failed = append(failed, i)
	}
	return &causes.Partial{Decisions: d, Failed: failed, Err: causeErr{"refused"}}
}

// TestPartialFailureStaysDenied: a request a live part of the Store denied
// is OVER_LIMIT although another part failed; only the failed hits get
// their failure modes (open: failed_open), the denied one is counted
// over_limit, and the failure is counted.
func TestPartialFailureStaysDenied(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, err := service.New(service.Options{Store: partialStore{}, Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(loadSet(t))
	resp, err := svc.ShouldRateLimit(context.Background(), req("svc", d("user", "u"), d("open", "k")))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetOverallCode().String(); got != "OVER_LIMIT" {
		t.Fatalf("overall %s, want OVER_LIMIT: a live denial decides the request", got)
	}
	if c := resp.GetStatuses()[0].GetCode().String(); c != "OVER_LIMIT" {
		t.Errorf("status of the denied descriptor %s, want OVER_LIMIT", c)
	}
	for _, c := range []struct{ rule, result string }{{"svc.user", "over_limit"}, {"svc.open", "failed_open"}} {
		if v := metricValue(t, reg, "ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": c.rule, "result": c.result}); v != 1 {
			t.Errorf("decisions{rule=%s,result=%s} = %v, want 1", c.rule, c.result, v)
		}
	}
	if v := metricValue(t, reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "refused"}); v != 1 {
		t.Errorf("backend_errors{refused} = %v, want 1", v)
	}
	// The Redis store's error type is what the service recognises.
	var pf service.PartialFailure
	if !errors.As(error(&causes.Partial{Err: errDown}), &pf) {
		t.Fatal("*causes.Partial does not implement service.PartialFailure")
	}
}
