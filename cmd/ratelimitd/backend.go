package main

import (
	"context"
	"fmt"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/events"
	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// Health service names reported by grpc.health.v1 (README.md, "Health"
// below the flag table): "" and the RLS service name; "ratelimit" is the
// name envoyproxy/ratelimit reports, kept so existing probes keep working.
const (
	rlsServiceName = "envoy.service.ratelimit.v3.RateLimitService"
	legacyHealth   = "ratelimit"
	// backendHealth reports the store's reachability (service.Healther)
	// on its own: an unreachable backend does not make the service
	// NOT_SERVING, since every rule has a failure mode (README.md,
	// "Health"; docs/responses.md for what Envoy then sees).
	backendHealth = "ratelimitd.backend"
)

// resetter is implemented by stores with a local cache that must be
// dropped when the config changes (the Redis store's over-limit cache).
type resetter interface{ ResetCache() }

// newBackend builds the store of --backend and the failure_mode: local
// fallback (serveopts.NewStore), logs where the store points, and has release close
// them. ev receives the Redis circuit breaker's transitions.
func (s *server) newBackend(ev *events.Events) error {
	store, fallback, closeStore, err := serveopts.NewStore(s.opts, ev)
	if err != nil {
		return secrets.ScrubErr(fmt.Errorf("backend: %w", err), serveopts.Secrets(s.opts)...)
	}
	s.store, s.fallback = store, fallback
	s.log.Info("backend", serveopts.BackendTarget(s.opts)...)
	s.onClose(func() {
		if err := closeStore(); err != nil {
			s.log.Warn("closing backend", "err", err)
		}
	})
	return nil
}

// serving is the health of "" and the RLS service: a config is loaded and
// shutdown has not started.
func (s *server) serving() bool { return s.svc.Ready() && s.warm.Load() && !s.stopping.Load() }

func (s *server) updateHealth() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.serving() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	// SetServingStatus is cheap, and grpc-go's Watch sends a status to a
	// stream only when it changed, so polling often costs nothing visible.
	for _, name := range []string{"", rlsServiceName, legacyHealth} {
		s.health.SetServingStatus(name, st)
	}
	if h, ok := s.store.(service.Healther); ok {
		bs := healthpb.HealthCheckResponse_NOT_SERVING
		up := h.Healthy()
		if up && !s.stopping.Load() {
			bs = healthpb.HealthCheckResponse_SERVING
		}
		s.health.SetServingStatus(backendHealth, bs)
		s.logBackendTransition(up)
	}
	s.updateDurableHealth()
}

// The backend health last logged (server.backendLogged).
const (
	backendUnknown int32 = iota // nothing logged yet
	backendUp
	backendDown
)

// logBackendTransition logs once when the backend becomes healthy
// (warmed at startup, or recovered) and once when it stops being healthy
// (circuit open, writes or credentials refused), with the breaker state;
// and, when it was never healthy, once the warm-up has ended (Redis down
// from startup), the unhealthy line.
func (s *server) logBackendTransition(up bool) {
	want := backendDown
	if up {
		want = backendUp
	} else if !s.warm.Load() {
		return // still warming up: the warm-up logs its own outcome
	}
	if s.backendLogged.Swap(want) == want {
		return
	}
	state := ""
	if b, ok := s.store.(interface{ BreakerState() string }); ok {
		state = b.BreakerState()
	}
	if up {
		s.log.Info("backend healthy: decisions are counted", "backend", s.opts.Backend, "circuit", state)
		return
	}
	s.log.Warn("backend unhealthy: decisions get the rules' failure modes until it answers again", "backend", s.opts.Backend, "circuit", state)
}

// warmer is implemented by a Store that can prepare its connections
// before serving (the Redis store: pools dialed, slot map, script).
type warmer interface {
	Warm(ctx context.Context) error
}

// startWarmup warms the backend in the background, bounded by
// --redis-warmup, and marks the server warm when it ends (at once for a
// store without warm-up or with --redis-warmup=0). Health is NOT_SERVING
// until then; requests are served meanwhile (with the rules' failure modes
// if Redis does not answer). Startup never requires Redis.
func (s *server) startWarmup(ctx context.Context) {
	w, ok := s.store.(warmer)
	if !ok || s.opts.RedisWarmup <= 0 {
		s.warm.Store(true)
		return
	}
	go func() {
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, s.opts.RedisWarmup)
		err := w.Warm(wctx)
		cancel()
		switch {
		case err != nil && (ctx.Err() != nil || s.stopping.Load()):
			// Shutdown came first: --redis-warmup did not run out, and
			// the server is not serving.
			s.log.Info("backend warm-up stopped: shutting down", "backend", s.opts.Backend)
			s.warm.Store(true)
			return
		case err != nil && !s.svc.Ready():
			s.log.Warn("backend warm-up did not finish within --redis-warmup; health stays NOT_SERVING until a config loads, then decisions get the rules' failure modes until Redis answers",
				"backend", s.opts.Backend, "redis_warmup", s.opts.RedisWarmup.String(), "err", err.Error())
		case err != nil:
			s.log.Warn("backend warm-up did not finish within --redis-warmup: serving; decisions get the rules' failure modes until Redis answers",
				"backend", s.opts.Backend, "redis_warmup", s.opts.RedisWarmup.String(), "err", err.Error())
		default:
			s.log.Info("backend warm: connections dialed, script loaded", "backend", s.opts.Backend, "took", time.Since(start).Round(time.Millisecond).String())
		}
		s.warm.Store(true)
		s.updateHealth()
	}()
}

// backendHealthPoll is how often the gRPC health of the backend
// ("ratelimitd.backend") is brought up to date with the Store's Healthy:
// the status lags the circuit breaker by at most this much.
const backendHealthPoll = 100 * time.Millisecond

// envoyFilterTimeout is the default timeout of Envoy's HTTP rate-limit
// filter (envoy.extensions.filters.http.ratelimit.v3.RateLimit.timeout).
const envoyFilterTimeout = 20 * time.Millisecond

// startHealthPoll brings the backend's gRPC health up to date every
// backendHealthPoll until the config source stops (only for a store that
// reports its health).
func (s *server) startHealthPoll() {
	_, fast := s.store.(service.Healther)
	if _, durable := s.durable.(service.Healther); !fast && !durable {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(backendHealthPoll)
		defer t.Stop()
		for {
			select {
			case <-s.watchCtx.Done():
				return
			case <-t.C:
				s.updateHealth()
			}
		}
	}()
}
