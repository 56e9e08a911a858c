package main

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// healthStore is a memory store whose Healthy the test sets.
type healthStore struct {
	*memory.Store
	healthy atomic.Bool
}

func (h *healthStore) Healthy() bool { return h.healthy.Load() }

// watchRecorder is a Health_WatchServer that records the statuses sent.
type watchRecorder struct {
	healthpb.Health_WatchServer
	ctx  context.Context
	sent chan healthpb.HealthCheckResponse_ServingStatus
}

func (w *watchRecorder) Context() context.Context { return w.ctx }
func (w *watchRecorder) Send(r *healthpb.HealthCheckResponse) error {
	w.sent <- r.GetStatus()
	return nil
}

// TestUpdateHealthBackendChangesOnly: updateHealth brings the backend's
// gRPC health ("ratelimitd.backend") to the Store's Healthy, and a Watch
// stream is sent a status only when it changes, however often the poll runs.
func TestUpdateHealthBackendChangesOnly(t *testing.T) {
	store := &healthStore{Store: memoryStore(t)}
	store.healthy.Store(true)
	svc := newTestService(t, service.Options{Store: store})
	s := &server{svc: svc, store: store, health: health.NewServer(), log: slog.New(slog.DiscardHandler)}
	s.warm.Store(true)
	s.updateHealth()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &watchRecorder{ctx: ctx, sent: make(chan healthpb.HealthCheckResponse_ServingStatus, 16)}
	done := make(chan error, 1)
	go func() { done <- s.health.Watch(&healthpb.HealthCheckRequest{Service: backendHealth}, w) }()
	next := func() healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		select {
		case st := <-w.sent:
			return st
		case <-time.After(5 * time.Second):
			t.Fatal("no status sent to the Watch stream")
			return 0
		}
	}
	if st := next(); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first status = %v, want SERVING", st)
	}
	for range 20 { // many polls, no change
		s.updateHealth()
	}
	store.healthy.Store(false)
	for range 20 {
		s.updateHealth()
	}
	if st := next(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("after the store turned unhealthy: %v, want NOT_SERVING (unchanged statuses must not be sent)", st)
	}
	store.healthy.Store(true)
	s.updateHealth()
	if st := next(); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("after the store recovered: %v, want SERVING", st)
	}
	select {
	case st := <-w.sent:
		t.Fatalf("extra status %v sent without a change", st)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
}

// TestBackendDownFromStartupLogged: a backend that is never healthy (Redis
// down from startup) gets the "backend unhealthy" line once the warm-up
// has ended, once however often health is polled, and "backend healthy"
// once when it answers.
func TestBackendDownFromStartupLogged(t *testing.T) {
	store := &healthStore{Store: memoryStore(t)}
	svc := newTestService(t, service.Options{Store: store})
	logs := &testproc.Buffer{}
	s := &server{svc: svc, store: store, health: health.NewServer(), log: slog.New(slog.NewJSONHandler(logs, nil))}
	count := func(msg string) int { return strings.Count(logs.String(), msg) }
	for range 5 { // warming up: the warm-up logs its own outcome
		s.updateHealth()
	}
	if n := count("backend unhealthy"); n != 0 {
		t.Fatalf("%d unhealthy lines during the warm-up, want 0", n)
	}
	s.warm.Store(true) // the warm-up gave up: Redis is down
	for range 20 {
		s.updateHealth()
	}
	if n := count("backend unhealthy: decisions get the rules' failure modes until it answers again"); n != 1 {
		t.Fatalf("%d unhealthy lines after the warm-up ended with the backend down, want 1:\n%s", n, logs.String())
	}
	store.healthy.Store(true)
	for range 5 {
		s.updateHealth()
	}
	if n := count("backend healthy: decisions are counted"); n != 1 {
		t.Fatalf("%d healthy lines once the backend answered, want 1:\n%s", n, logs.String())
	}
}
