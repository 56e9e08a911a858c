package service_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// stallStore holds every Take until its context ends, then fails with the
// context's error; entered receives one value per Take.
type stallStore struct{ entered chan struct{} }

func (s stallStore) Take(ctx context.Context, _ []algo.Hit, _ []algo.Decision) error {
	s.entered <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// TestCallerCancelledDecidesNothing: a caller that cancels while the Store
// call is pending gets Canceled; no failure mode is applied (the local
// fallback is not asked), no decision is counted, and the backend error
// is counted with cause "canceled", for every failure mode.
func TestCallerCancelledDecidesNothing(t *testing.T) {
	for _, key := range []string{"open", "closed", "local"} {
		t.Run(key, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			st := stallStore{entered: make(chan struct{}, 1)}
			fallback := newStore(t, &clock{now: t0})
			svc, err := service.New(service.Options{Store: st, Fallback: fallback, Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			svc.SetPolicy(loadSet(t))
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-st.entered; cancel() }()
			resp, err := svc.ShouldRateLimit(ctx, req("svc", d(key, "k")))
			if status.Code(err) != codes.Canceled {
				t.Fatalf("resp %v err %v, want Canceled", resp, err)
			}
			if n := fallback.Calls(); n != 0 {
				t.Errorf("fallback asked %d times for a request nobody waits for", n)
			}
			for _, result := range []string{"ok", "near_limit", "over_limit", "shadow", "failed_open", "failed_closed"} {
				if v := metricValue(t, reg, "ratelimitd_decisions_total", map[string]string{"domain": "svc", "rule": "svc." + key, "result": result}); v != 0 {
					t.Errorf("decisions{result=%s} = %v, want 0: nothing was decided", result, v)
				}
			}
			if v := metricValue(t, reg, "ratelimitd_backend_errors_total", map[string]string{"cause": "canceled"}); v != 1 {
				t.Errorf("backend_errors{canceled} = %v, want 1", v)
			}
		})
	}
}
