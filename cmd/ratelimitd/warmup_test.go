package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/health"

	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// stalledWarmer is a store whose warm-up never finishes before its
// context ends (Redis not answering).
type stalledWarmer struct{ *healthStore }

func (stalledWarmer) Warm(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// warmupServer returns a server on a stalled warm-up, with a config in
// force when loaded, and its log.
func warmupServer(t *testing.T, warmup time.Duration, loaded bool) (*server, *testproc.Buffer) {
	t.Helper()
	store := stalledWarmer{&healthStore{Store: memoryStore(t)}}
	svc := newTestService(t, service.Options{Store: store})
	if loaded {
		set, _, err := policy.LoadSources(policy.LoadOptions{}, policy.Source{Name: "a.yaml", Data: []byte("domain: d\n")})
		if err != nil {
			t.Fatal(err)
		}
		svc.SetPolicy(set)
	}
	logs := &testproc.Buffer{}
	s := &server{svc: svc, store: store, health: health.NewServer(), log: slog.New(slog.NewJSONHandler(logs, nil)),
		opts: serveopts.Options{Backend: "redis", RedisWarmup: warmup}}
	return s, logs
}

// waitWarm waits until the warm-up goroutine has ended.
func waitWarm(t *testing.T, s *server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !s.warm.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the warm-up did not end")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWarmupLogTellsTheTruth: the warm-up's give-up line says the server is
// serving only when it is (a config in force), and a shutdown during the
// warm-up (SIGTERM cancels Run's context) does not claim --redis-warmup ran
// out.
func TestWarmupLogTellsTheTruth(t *testing.T) {
	const gaveUp = "backend warm-up did not finish within --redis-warmup"
	t.Run("shutdown", func(t *testing.T) {
		s, logs := warmupServer(t, time.Hour, true)
		ctx, cancel := context.WithCancel(context.Background())
		s.startWarmup(ctx)
		cancel()
		waitWarm(t, s)
		if strings.Contains(logs.String(), gaveUp) || strings.Contains(logs.String(), "serving") {
			t.Errorf("a shutdown during the warm-up logged a timeout or a serving claim:\n%s", logs.String())
		}
		if !strings.Contains(logs.String(), "backend warm-up stopped: shutting down") {
			t.Errorf("no line saying the warm-up stopped for the shutdown:\n%s", logs.String())
		}
	})
	t.Run("timeout, config loaded", func(t *testing.T) {
		s, logs := warmupServer(t, 5*time.Millisecond, true)
		s.startWarmup(context.Background())
		waitWarm(t, s)
		if !strings.Contains(logs.String(), gaveUp+": serving;") {
			t.Errorf("want the give-up line saying it serves:\n%s", logs.String())
		}
	})
	t.Run("timeout, no config", func(t *testing.T) {
		s, logs := warmupServer(t, 5*time.Millisecond, false)
		s.startWarmup(context.Background())
		waitWarm(t, s)
		out := logs.String()
		if !strings.Contains(out, gaveUp) || strings.Contains(out, gaveUp+": serving") || !strings.Contains(out, "NOT_SERVING until a config loads") {
			t.Errorf("want the give-up line saying health stays NOT_SERVING until a config loads:\n%s", out)
		}
	})
}
