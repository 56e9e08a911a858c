package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/health"

	"github.com/ratelimitd/ratelimitd/internal/boundary"
	"github.com/ratelimitd/ratelimitd/internal/configsource"
	"github.com/ratelimitd/ratelimitd/internal/events"
	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/listen"
	"github.com/ratelimitd/ratelimitd/internal/logging"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/lease"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// server is `ratelimitd serve`: built from validated serveopts.Options by newServer
// (store, telemetry, service, listeners, config source; files
// backend.go, telemetry.go, listeners.go, configsource.go), run by Run
// until its context is done, stopped by Shutdown.
type server struct {
	opts   serveopts.Options
	log    *slog.Logger
	svc    *service.Service
	rlqs   *rlqs.Server // the Rate Limit Quota Service on the gRPC port
	store  service.Store
	health *health.Server
	loaded atomic.Bool // a good config is in force
	// warm is set once the backend's startup warm-up ended (warmed, or
	// --redis-warmup passed): until then health is NOT_SERVING.
	warm atomic.Bool
	// backendLogged is the backend health last logged (backendUnknown,
	// backendUp, backendDown): transitions are logged once each.
	backendLogged atomic.Int32
	reloadMu      sync.Mutex  // serializes apply and fail (watcher, SIGHUP)
	stopping      atomic.Bool // shutdown started

	fallback service.Store // failure_mode: local store (nil: none)
	// durable is the store of `store: durable` limits (--durable-url;
	// nil: none); durableLogged is its health last logged.
	durable       service.Store
	durableLogged atomic.Int32
	reg           *prometheus.Registry
	tracing       *telemetry.Tracing
	statsd        *statsd.Client // nil without --statsd-addr
	// closers release what newServer built, run in reverse by release.
	closers []func()

	grpcLn, httpLn, debugLn, metricsLn net.Listener   // debugLn, metricsLn: nil when off
	servers                            listen.Servers // the gRPC, HTTP, debug and metrics servers
	json                               boundary.JSON  // who may POST /json

	source configsource.Source // files or xDS
	hup    chan os.Signal      // SIGHUP: reload the config files

	watchCtx  context.Context // the config source's and pollers' lifetime
	stopWatch context.CancelFunc
	wg        sync.WaitGroup // goroutines Run started
	fatal     chan error     // a server or the config source failed
	running   atomic.Bool    // Run (or a Shutdown before it) started
	stop      chan struct{}  // closed by Shutdown
	stopOnce  sync.Once
	done      chan struct{} // closed when Run returned
}

// errServerStopped is Run's error on a server already run or shut down.
var errServerStopped = errors.New("server already run or shut down")

// serve builds the server of o and runs it until ctx is done
// (SIGTERM/SIGINT); see Run. It applies the GC policy gc (serveopts.ChooseGC) and
// logs it first, with warnings.
func serve(ctx context.Context, o serveopts.Options, gc gcpolicy.Policy, warnings []string, logOut io.Writer) error {
	s, err := newServer(o, gc, warnings, logOut)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// newServer builds everything `serve` runs from o (validated): the
// process logger (slog's default from then on, go-redis' too), the GC
// policy gc, the store, tracing, metrics and statsd, the service, the
// listeners (so a taken port fails here, before anything runs) and the
// config source. Nothing is served until Run. On error, what was built
// is released.
func newServer(o serveopts.Options, gc gcpolicy.Policy, warnings []string, logOut io.Writer) (_ *server, err error) {
	log := logging.New(o.LogLevel, o.LogFormat, logOut)
	slog.SetDefault(log)
	// go-redis' own log lines (pool dial errors, …) go through slog too.
	redis.SetLogger(redis.NewSlogLogger(log, redis.LogEvery, time.Now))
	logStartup(log, o, gc, warnings)
	s := &server{opts: o, log: log, health: health.NewServer(), hup: make(chan os.Signal, 1),
		fatal: make(chan error, 4), stop: make(chan struct{}), done: make(chan struct{})}
	// SIGHUP reloads the config instead of ending the process.
	signal.Notify(s.hup, syscall.SIGHUP)
	s.onClose(func() { signal.Stop(s.hup) })
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	ev := events.New(log, o.Backend)
	for _, step := range []func() error{
		func() error { return s.newBackend(ev) },
		s.newDurable,
		func() error { return s.newTelemetry(ev) },
		s.newService,
		s.newRLQS,
		s.openListeners,
		s.newGRPCServer,
		s.newHTTPServers,
		s.newConfigSource,
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// newService builds the service on the store, with the metrics and
// statsd client of newTelemetry.
func (s *server) newService() error {
	so, err := serveopts.ServiceOptions(s.opts)
	if err != nil {
		return err
	}
	so.Store, so.Fallback, so.Registerer, so.Statsd, so.Logger = s.tracing.Store(s.store), s.fallback, s.reg, s.statsd, s.log
	if s.durable != nil {
		so.Durable = s.tracing.Store(s.durable)
	}
	// Rules with consistency: leased decide from leases when the store
	// charges them (memory, Redis); on memcached they are decided in the
	// store like the others.
	if st, ok := s.store.(lease.Store); ok {
		l, err := lease.New(serveopts.LeaseOptions(s.opts, st, s.reg, s.log))
		if err != nil {
			return err
		}
		so.Leases = l
		s.onClose(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = l.Close(ctx)
		})
	}
	if s.svc, err = service.New(so); err != nil {
		return err
	}
	s.updateHealth()
	return nil
}

// newRLQS builds the Rate Limit Quota Service on the store: usage is
// charged to the same counters as ShouldRateLimit's (`store: durable`
// limits on the durable store), and the demand of the
// Envoys' streams is shared among replicas through the store (Redis); on
// memory one process is the whole fleet. memcached cannot share the
// demand, and replicas each dividing the whole remainder would over-admit
// by an unstated amount, so RLQS is not served there (logged): Envoy then
// applies its no-assignment behaviour.
func (s *server) newRLQS() error {
	ro := serveopts.RLQSOptions(s.opts, s.tracing.Store(s.store))
	ro.Registerer, ro.Logger = s.reg, s.log
	ro.UnknownDomain = s.svc.CountUnknownDomain
	if l, ok := s.store.(rlqs.LeaseStore); ok && (s.opts.Backend == "memory" || s.opts.Backend == "redis" && s.opts.Redis.WindowKeys) {
		// The store itself (the tracing wrapper does not pass Lease on),
		// where a lease counts on the counter Take decides: the memory
		// store, and Redis with window keys.
		ro.Leases = l
	}
	if s.durable != nil {
		ro.Durable = s.tracing.Store(s.durable)
	}
	if d, ok := s.store.(rlqs.Demand); ok {
		ro.Demand = d
	} else if s.opts.Backend == "memcache" {
		s.log.Warn("rlqs: not served on the memcached backend: it cannot share the Envoys' demand among replicas, so several replicas would over-admit; use Redis, or memory with one replica")
		return nil
	}
	var err error
	s.rlqs, err = rlqs.New(ro)
	return err
}

// onClose adds f to what release runs (in reverse order of onClose).
func (s *server) onClose(f func()) { s.closers = append(s.closers, f) }

// release runs the closers, last added first: the admin gRPC server,
// statsd (flushed), tracing (flushed), the store, the SIGHUP handler.
func (s *server) release() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// Run serves until ctx is done, Shutdown is called or a server fails,
// then shuts down gracefully: health NOT_SERVING, --drain (not after a
// failure), stop accepting, in-flight calls finish within
// --shutdown-grace, then everything newServer built is released. It
// returns nil after a clean shutdown, the failure otherwise. A server
// runs once.
func (s *server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errServerStopped
	}
	defer close(s.done)
	s.startWarmup(ctx)
	s.updateHealth()
	s.watchCtx, s.stopWatch = context.WithCancel(context.Background())
	s.startConfigSource()
	s.startHealthPoll()
	s.logListening()
	s.servers.Serve(s.fatal)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if s.rlqs != nil {
			s.rlqs.Run(s.watchCtx)
		}
	}()

	var runErr error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", "drain", s.opts.Drain, "grace", s.opts.ShutdownGrace)
	case <-s.stop:
		s.log.Info("shutting down", "drain", s.opts.Drain, "grace", s.opts.ShutdownGrace)
	case runErr = <-s.fatal:
		s.log.Error("fatal", "err", runErr)
	}
	s.shutdown(runErr == nil)
	return runErr
}

// Shutdown makes Run shut down as when its context is done and waits for
// Run to return, or for ctx; on a server that never ran it releases what
// newServer built. It returns ctx's error when ctx ended first.
func (s *server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	if s.running.CompareAndSwap(false, true) {
		s.release()
		close(s.done)
		return nil
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdown is Run's end: NOT_SERVING, drain (when drain is true and
// --drain > 0), the config source stops, the servers stop within
// --shutdown-grace, Run's goroutines end, then release.
func (s *server) shutdown(drain bool) {
	s.stopping.Store(true)
	s.svc.SetShuttingDown()
	s.updateHealth()
	s.health.Shutdown()
	if drain && s.opts.Drain > 0 {
		time.Sleep(s.opts.Drain)
	}
	s.stopWatch()
	// RLQS streams get their assignments with a 1 s TTL and end, so the
	// graceful stop below does not wait on them and no Envoy keeps an
	// assignment of this replica for longer.
	if s.rlqs != nil {
		s.rlqs.Shutdown()
	}
	s.servers.Stop(s.opts.ShutdownGrace, s.log)
	s.wg.Wait()
	s.log.Info("stopped")
	s.release()
}
