package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// Health service names reported by grpc.health.v1. "" and the RLS service
// name follow the contract; "ratelimit" is the name envoyproxy/ratelimit
// reports, kept so existing probes keep working.
const (
	rlsServiceName = "envoy.service.ratelimit.v3.RateLimitService"
	legacyHealth   = "ratelimit"
	// backendHealth reports the store's reachability (service.Healther)
	// on its own: an unreachable backend does not make the service
	// NOT_SERVING, since every rule has a failure mode (contract, HTTP).
	backendHealth = "ratelimitd.backend"
)

// newLogger builds the process logger from --log-level and --log-format.
// Durations print as Go duration strings ("10ms", "1m30s") in both
// formats: the JSON handler alone would print nanoseconds (10000000).
func newLogger(o Options, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(o.LogLevel)) // validated by Options.Validate
	ho := &slog.HandlerOptions{Level: level, ReplaceAttr: durationString}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// durationString is the loggers' slog.HandlerOptions.ReplaceAttr: an
// attribute of kind slog.KindDuration becomes its time.Duration.String()
// ("10ms"); every other attribute is returned unchanged.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// resetter is implemented by stores with a local cache that must be
// dropped when the config changes (the Redis store's over-limit cache).
type resetter interface{ ResetCache() }

// newStore builds the configured backend store and the in-process fallback
// for failure_mode: local (nil for the memory backend). Both in-memory
// stores hold at most --memory-max-keys keys; beyond that a request that
// needs a new key drops an expired key or, when none has expired, fails
// with memory.ErrFull (cause "oom") and its rule's failure mode decides.
// onCircuit, when not nil, is the Redis circuit breaker's OnTransition.
func newStore(o Options, onCircuit func(redis.BreakerState)) (service.Store, service.Store, func() error, error) {
	mem := func() (*memory.Store, error) { return memory.New(memory.Options{MaxKeys: o.MemoryMaxKeys}) }
	switch o.Backend {
	case "redis":
		ro := redisOptions(o)
		ro.Breaker.OnTransition = onCircuit
		rs, err := redis.New(ro)
		if err != nil {
			return nil, nil, nil, err
		}
		fb, err := mem()
		if err != nil {
			_ = rs.Close()
			return nil, nil, nil, err
		}
		return rs, fb, func() error { return errors.Join(rs.Close(), fb.Close()) }, nil
	case "memcache":
		ms, err := memcache.New(memcacheOptions(o))
		if err != nil {
			return nil, nil, nil, err
		}
		fb, err := mem()
		if err != nil {
			_ = ms.Close()
			return nil, nil, nil, err
		}
		return ms, fb, func() error { return errors.Join(ms.Close(), fb.Close()) }, nil
	default:
		ms, err := mem()
		if err != nil {
			return nil, nil, nil, err
		}
		return ms, nil, ms.Close, nil
	}
}

// retryJitter maps --retry-jitter onto service.Options.RetryJitter, where 0
// means the default (1s) and a negative value disables jitter: the flag's 0
// means no jitter.
func retryJitter(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// server holds the running pieces of `ratelimitd serve`.
type server struct {
	opts   Options
	log    *slog.Logger
	svc    *service.Service
	store  service.Store
	health *health.Server
	loaded atomic.Bool // a good config is in force
	// warm is set once the backend's startup warm-up ended (warmed, or
	// --redis-warmup passed): until then health is NOT_SERVING.
	warm atomic.Bool
	// backendUp is the backend health last logged (transitions are
	// logged once each: recovered, unhealthy).
	backendUp atomic.Bool
	reloadMu  sync.Mutex  // serializes apply and fail (watcher, SIGHUP)
	stopping  atomic.Bool // shutdown started
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
}

// logBackendTransition logs once when the backend becomes healthy
// (warmed at startup, or recovered) and once when it stops being healthy
// (circuit open, writes or credentials refused), with the breaker state.
func (s *server) logBackendTransition(up bool) {
	if s.backendUp.Swap(up) == up {
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
	if !s.warm.Load() {
		return // still warming up: the warm-up logs its own outcome
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
		if err != nil {
			s.log.Warn("backend warm-up did not finish within --redis-warmup: serving; decisions get the rules' failure modes until Redis answers",
				"backend", s.opts.Backend, "redis_warmup", s.opts.RedisWarmup.String(), "err", err.Error())
		} else {
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

// serve runs the service until ctx is done (SIGTERM/SIGINT), then shuts
// down gracefully: health NOT_SERVING, --drain, stop accepting, in-flight
// calls finish within --shutdown-grace. It returns nil after a clean
// shutdown. It applies the GC policy gc (chooseGC) and logs it first.

func serve(ctx context.Context, o Options, gc gcPolicy, warnings []string, logOut io.Writer) error {
	// SIGHUP reloads the config (below) instead of ending the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	log := newLogger(o, logOut)
	slog.SetDefault(log)
	// go-redis' own log lines (pool dial errors, …) go through slog too.
	redis.SetLogger(newRedisLogger(log, redisLogEvery, time.Now))
	if o.ConfigSource == "xds" {
		log.Info("starting ratelimitd", "version", version, "commit", commit, "backend", o.Backend, "config_source", "xds", "xds_server", o.XDSServerURL, "xds_node_id", o.XDSNodeID)
	} else {
		log.Info("starting ratelimitd", "version", version, "commit", commit, "backend", o.Backend, "config", o.Config)
	}
	msg, attrs := o.modeLog()
	log.Info(msg, attrs...)
	gc.apply()
	gc.log(log)
	for _, w := range warnings {
		log.Warn(w)
	}
	if o.Backend == "redis" && o.RedisTimeout >= envoyFilterTimeout {
		log.Warn("--redis-timeout is not below Envoy's default rate-limit filter timeout: with Redis frozen, a call's budget (Envoy's deadline less --redis-deadline-margin) runs out before Redis has been silent for --redis-timeout, so the per-rule failure modes cannot tell a dead Redis (failure_mode open requests then get DeadlineExceeded and Envoy's own failure_mode_deny decides); keep it well under the filter's timeout",
			"redis_timeout", o.RedisTimeout.String(), "envoy_default_timeout", envoyFilterTimeout.String())
	}
	if o.KeyValues == "clear" {
		log.Warn("--key-values=clear: descriptor values are stored in clear text in backend keys (development only)")
	}

	ev := newEvents(log, o.Backend)
	store, fallback, closeStore, err := newStore(o, ev.onCircuit)
	if err != nil {
		return scrubErr(fmt.Errorf("backend: %w", err), secretsOf(o)...)
	}
	log.Info("backend", backendTarget(o)...)
	defer func() {
		if err := closeStore(); err != nil {
			log.Warn("closing backend", "err", err)
		}
	}()

	tr, err := telemetry.Setup(ctx, telemetry.Options{
		Enabled: o.Tracing, Endpoint: o.TracingEndpoint, Insecure: o.TracingInsecure,
		SampleRatio: o.TracingSampleRatio, ServiceName: o.TracingServiceName,
	})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(sctx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := registerBackendMetrics(reg, store); err != nil {
		return fmt.Errorf("backend metrics: %w", err)
	}
	if err := ev.register(reg); err != nil {
		return fmt.Errorf("event metrics: %w", err)
	}
	sc, stopStatsd, err := startStatsd(o, reg, log)
	if err != nil {
		return err
	}
	defer stopStatsd()
	addLocalCacheStats(sc, store)
	so, err := serviceOptions(o)
	if err != nil {
		return err
	}
	so.Store, so.Fallback, so.Registerer, so.Statsd, so.Logger = tr.Store(store), fallback, reg, sc, log
	svc, err := service.New(so)
	if err != nil {
		return err
	}
	s := &server{opts: o, log: log, svc: svc, store: store, health: health.NewServer()}
	s.startWarmup(ctx)
	s.updateHealth()

	// Listeners first, so a taken port fails startup before anything runs.
	var lns []net.Listener
	closeAll := func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}
	listen := func(name, addr string) (net.Listener, error) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("%s listener: %w", name, err)
		}
		lns = append(lns, l)
		return l, nil
	}
	grpcLn, err := listen("grpc", o.GRPCAddr)
	if err != nil {
		return err
	}
	httpLn, err := listen("http", o.HTTPAddr)
	if err != nil {
		return err
	}
	var debugLn, metricsLn net.Listener
	if o.DebugAddr != "" {
		if debugLn, err = listen("debug", o.DebugAddr); err != nil {
			return err
		}
	}
	if o.MetricsAddr != "" {
		if metricsLn, err = listen("metrics", o.MetricsAddr); err != nil {
			return err
		}
	}

	gopts := append([]grpc.ServerOption{svc.ServerOption()}, grpcServerOptions(o)...)
	if ic := svc.UnaryServerInterceptor(); ic != nil {
		gopts = append(gopts, grpc.ChainUnaryInterceptor(ic))
	}
	if o.Tracing {
		// With tracing off the otelgrpc stats handler would only start
		// no-op spans, at ~1-2 µs of CPU per call (BENCHMARKS.md, "CPU
		// per decision").
		gopts = append(gopts, tr.ServerOption())
	}
	if o.GRPCTLSCert != "" {
		tc, err := newTLSReloader(o.GRPCTLSCert, o.GRPCTLSKey, o.GRPCTLSClientCA, o.GRPCTLSClientSAN, false, log)
		if err != nil {
			closeAll()
			return err
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tc.Config())))
	}
	grpcLn = limitConns(grpcLn, o.GRPCMaxConnections)
	gs := grpc.NewServer(gopts...)
	svc.Register(gs)
	healthpb.RegisterHealthServer(gs, s.health)
	reflection.Register(gs)

	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, r *http.Request) {
		if !s.serving() {
			http.Error(w, "NOT SERVING", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "OK")
	})
	jb := jsonBoundaryOf(o)
	mux.Handle("/json", jb.guard(svc.JSONHandler()))
	mux.Handle("/metrics", metrics)
	httpServer := newHTTPServer(o, mux, true)
	if o.HTTPTLS {
		if httpServer.TLSConfig, err = httpTLSConfig(o, log); err != nil {
			closeAll()
			return err
		}
	}
	servers := []*http.Server{httpServer}
	serveLns := []net.Listener{httpLn}
	var adminGS *grpc.Server
	if debugLn != nil {
		var ds *http.Server
		if ds, adminGS, err = s.debugServer(); err != nil {
			closeAll()
			return err
		}
		defer adminGS.Stop()
		servers = append(servers, ds)
		serveLns = append(serveLns, debugLn)
	}
	if metricsLn != nil {
		mm := http.NewServeMux()
		mm.Handle("/metrics", metrics)
		servers = append(servers, newHTTPServer(o, mm, true))
		serveLns = append(serveLns, metricsLn)
	}

	// Config: first load and hot reload.
	loadOpts := policy.LoadOptions{
		MergeDomains:   o.MergeDomains,
		IgnoreDotFiles: o.IgnoreDotfiles,
		Keys:           policy.KeyOptions{Prefix: o.KeyPrefix, ClearText: o.KeyValues == "clear"},
		MaxRules:       o.MaxConfigRules,
		MaxBytes:       o.MaxConfigBytes,
	}
	if al, ok := store.(service.AlgorithmLister); ok {
		// A limit of an algorithm the backend does not decide is refused
		// at load (file:line, naming the backend): the config in force
		// stays, and at startup the service is not SERVING.
		loadOpts.Algorithms, loadOpts.Backend = al.Algorithms(), o.Backend
	}
	var xdsOpts xds.Options
	if o.ConfigSource == "xds" {
		if xdsOpts, err = xdsOptions(o, log, loadOpts); err != nil {
			closeAll()
			return err
		}
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	var wg sync.WaitGroup
	fatal := make(chan error, 4)
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Both sources hand every load to the same swap (s.apply) or
		// rejection (s.fail): the same metrics and log lines.
		var err error
		if o.ConfigSource == "xds" {
			err = xds.Run(watchCtx, xdsOpts, s.apply, s.fail)
		} else {
			err = policy.Watch(watchCtx, loadOpts, o.Config, s.apply, s.fail)
		}
		if err != nil && watchCtx.Err() == nil {
			fatal <- fmt.Errorf("config watch: %w", err)
		}
	}()
	// SIGHUP: load the config now (a file given directly whose directory
	// is not watchable, or a change the watcher cannot see, e.g. on some
	// network file systems); the process keeps running.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-watchCtx.Done():
				return
			case <-hup:
				if o.ConfigSource == "xds" {
					log.Info("SIGHUP: the config comes from xDS (--config-source=xds) and is pushed by the management server; nothing to reload")
					continue
				}
				log.Info("SIGHUP: reloading config", "config", o.Config)
				set, warns, err := policy.Load(loadOpts, o.Config...)
				if err != nil {
					s.fail(err)
				} else {
					s.apply(set, warns)
				}
			}
		}
	}()

	// Backend health poll (only when the store reports it).
	if _, ok := store.(service.Healther); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(backendHealthPoll)
			defer t.Stop()
			for {
				select {
				case <-watchCtx.Done():
					return
				case <-t.C:
					s.updateHealth()
				}
			}
		}()
	}

	log.Info("listening", "server", "grpc", "addr", grpcLn.Addr().String(), "tls", o.GRPCTLSCert != "", "mtls", o.GRPCTLSClientCA != "")
	log.Info("listening", "server", "http", "addr", httpLn.Addr().String(), "tls", o.HTTPTLS, "json", jb.describe())
	if debugLn != nil {
		access := "loopback connections only"
		if o.DebugTokenFile != "" {
			access = "loopback connections, others with the bearer token of --debug-token-file"
		}
		log.Info("listening", "server", "debug", "addr", debugLn.Addr().String(), "access", access)
		if !isLoopbackAddr(debugLn.Addr().String()) && o.DebugTokenFile == "" {
			log.Warn("debug listener bound beyond loopback without --debug-token-file: it answers 403 to every non-loopback connection", "addr", debugLn.Addr().String())
		}
	}
	if metricsLn != nil {
		log.Info("listening", "server", "metrics", "addr", metricsLn.Addr().String())
	}
	wg.Add(1 + len(servers))
	go func() {
		defer wg.Done()
		if err := gs.Serve(grpcLn); err != nil {
			fatal <- fmt.Errorf("grpc server: %w", err)
		}
	}()
	for i, hs := range servers {
		go func() {
			defer wg.Done()
			serveFn := hs.Serve
			if hs.TLSConfig != nil {
				serveFn = func(l net.Listener) error { return hs.ServeTLS(l, "", "") }
			}
			if err := serveFn(serveLns[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fatal <- fmt.Errorf("http server: %w", err)
			}
		}()
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "drain", o.Drain, "grace", o.ShutdownGrace)
	case runErr = <-fatal:
		log.Error("fatal", "err", runErr)
	}

	// Shutdown: NOT_SERVING, drain, stop accepting, finish in-flight calls.
	s.stopping.Store(true)
	svc.SetShuttingDown()
	s.updateHealth()
	s.health.Shutdown()
	if runErr == nil && o.Drain > 0 {
		time.Sleep(o.Drain)
	}
	stopWatch()
	graceCtx, cancel := context.WithTimeout(context.Background(), o.ShutdownGrace)
	defer cancel()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	var hwg sync.WaitGroup
	for _, hs := range servers {
		hwg.Add(1)
		go func() {
			defer hwg.Done()
			if err := hs.Shutdown(graceCtx); err != nil {
				_ = hs.Close()
			}
		}()
	}
	select {
	case <-done:
	case <-graceCtx.Done():
		log.Warn("shutdown grace expired: cutting in-flight gRPC calls")
		gs.Stop()
		<-done
	}
	hwg.Wait()
	wg.Wait()
	log.Info("stopped")
	return runErr
}

// startStatsd starts the statsd client of --statsd-addr (nil, and a no-op
// stop, without it): envoyproxy/ratelimit's stats, its Go runtime stats
// under "ratelimit.go", and ratelimitd_statsd_* on reg. stop flushes once
// more and closes the socket; call it after the servers stopped.
func startStatsd(o Options, reg prometheus.Registerer, log *slog.Logger) (*statsd.Client, func(), error) {
	if o.StatsdAddr == "" {
		return nil, func() {}, nil
	}
	tags, err := parseStatsdTags(o.StatsdTags)
	if err != nil {
		return nil, nil, err
	}
	sc, err := statsd.New(statsd.Options{Addr: o.StatsdAddr, FlushInterval: o.StatsdFlushInterval, Registerer: reg, Logger: log, Tags: tags})
	if err != nil {
		return nil, nil, err
	}
	sc.AddRuntimeStats("ratelimit.go")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sc.Run(ctx)
	}()
	log.Info("sending statsd", "addr", o.StatsdAddr, "flush_interval", o.StatsdFlushInterval.String())
	return sc, func() {
		cancel()
		<-done
		_ = sc.Close()
	}, nil
}

// apply installs a freshly loaded config. It runs on the watcher's and on
// the SIGHUP goroutine, one at a time. A load whose content is the
// config in force's (same SourceHash) is a no-op: the policy, the
// detailed_metric label budget and the store's over-limit cache stay,
// it counts as result="unchanged" and logs at debug only.
func (s *server) apply(set *policy.Set, warnings []policy.Warning) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if cur := s.svc.Policy(); cur != nil && cur.SourceHash() == set.SourceHash() {
		s.svc.CountReload(service.ReloadUnchanged, nil)
		s.log.Debug("config unchanged; nothing applied", "hash", set.Hash())
		return
	}
	for _, w := range warnings {
		if w.File == "" {
			// About the load as a whole, e.g. "no rate-limit domains
			// loaded from …: every request is answered OK without
			// limits": the message is the log line.
			s.log.Warn(w.Message)
			continue
		}
		s.log.Warn("config warning", "warning", w.String())
	}
	s.svc.SetPolicy(set)
	if r, ok := s.store.(resetter); ok {
		r.ResetCache()
	}
	s.svc.CountReload(service.ReloadSuccess, set)
	first := !s.loaded.Swap(true)
	s.updateHealth()
	s.log.Info("config loaded", "domains", len(set.Domains()), "rules", len(set.Rules()), "hash", set.Hash(), "source_hash", set.SourceHash(), "first", first)
}

// fail records a load that put nothing in force; the last good config, if
// any, stays. A watcher error (policy.WatchError) and a read error
// (policy.IsReadError) are counted apart from a rejected config.
func (s *server) fail(err error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	loaded := s.loaded.Load()
	switch {
	case policy.IsWatchError(err):
		s.svc.CountReload(service.ReloadWatchError, nil)
		s.log.Warn("config watcher error; the config in force is unchanged, reloading", "err", err.Error())
		return
	case policy.IsReadError(err):
		s.svc.CountReload(service.ReloadReadError, nil)
		if loaded {
			s.log.Warn("config files could not be read; keeping the config in force", "err", err.Error())
			return
		}
		s.log.Error("config files could not be read; no config loaded yet: not serving (health NOT_SERVING, requests fail with "+s.noConfigCode()+") until a good config loads", "err", err.Error())
		return
	}
	s.svc.CountReload(service.ReloadFailure, nil)
	if loaded {
		s.log.Error("config rejected; keeping the last good config", "err", err.Error())
		return
	}
	s.log.Error("config rejected; no config loaded yet: not serving (health NOT_SERVING, requests fail with "+s.noConfigCode()+") until a good config loads", "err", err.Error())
}

// noConfigCode is the gRPC code of a call made before the first config
// is in force: the reference's Unknown in reference mode, else
// Unavailable.
func (s *server) noConfigCode() string {
	if s.opts.ReferenceAnswers {
		return "Unknown"
	}
	return "Unavailable"
}

// backendTarget are the attributes of the startup log line naming the
// store and where it points, with any password redacted.
func backendTarget(o Options) []any {
	if o.Backend == "memcache" {
		if o.MemcacheSRV != "" {
			return []any{"type", "memcache", "srv", o.MemcacheSRV, "srv_refresh", o.MemcacheSRVRefresh.String(), "timeout", o.MemcacheTimeout.String()}
		}
		return []any{"type", "memcache", "addrs", strings.Join(o.MemcacheAddrs, ","), "timeout", o.MemcacheTimeout.String()}
	}
	if o.Backend != "redis" {
		return []any{"type", o.Backend}
	}
	attrs := []any{"type", "redis", "mode", o.RedisMode, "url", redis.RedactURL(o.RedisURL)}
	if len(o.RedisAddrs) > 0 {
		attrs = append(attrs, "addrs", strings.Join(o.RedisAddrs, ","))
	}
	if o.RedisMaster != "" {
		attrs = append(attrs, "master", o.RedisMaster)
	}
	if o.RedisPasswordFile != "" {
		attrs = append(attrs, "password_file", o.RedisPasswordFile)
	}
	return attrs
}

// debugMux serves /rlconfig, the admin API (/admin/explain,
// /admin/reset; docs/admin.md) and /debug/pprof/ (cmdline with secrets
// redacted).
func (s *server) debugMux() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "/rlconfig: compiled rate-limit rules\n"+
			"POST /admin/explain: how a RateLimitRequest (JSON, as POST /json) would be decided now, without consuming\n"+
			"POST /admin/reset: delete the counters of a RateLimitRequest's descriptors\n"+
			"gRPC ratelimitd.admin.v1.Admin/{Explain,Reset}: the same over HTTP/2 on this port\n"+
			"/debug/pprof/: Go profiles\n")
	})
	m.HandleFunc("/rlconfig", func(w http.ResponseWriter, r *http.Request) {
		set := s.svc.Policy()
		if set == nil {
			http.Error(w, "no rate limit configuration loaded", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := set.WriteExplain(w); err != nil {
			s.log.Warn("rlconfig", "err", err)
		}
	})
	admin := s.svc.AdminHandler()
	m.Handle(service.AdminExplainPath, admin)
	m.Handle(service.AdminResetPath, admin)
	m.HandleFunc("/debug/pprof/", pprof.Index)
	m.HandleFunc("/debug/pprof/cmdline", cmdlineHandler(os.Args))
	m.HandleFunc("/debug/pprof/profile", pprof.Profile)
	m.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	m.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return m
}

// grpcStreamWorkers is the number of goroutines that serve gRPC streams
// (grpc.NumStreamWorkers): a call is handed to an idle worker instead of a
// new goroutine, whose stack would grow (copy) on every call; a call
// arriving while all are busy still gets its own goroutine. It covers the
// calls in flight of a few busy Envoys (each worker costs one idle
// goroutine).
const grpcStreamWorkers = 128

// grpcWindow is the initial HTTP/2 flow-control window of every stream
// and connection, in bytes. Setting it turns off grpc-go's dynamic window
// (BDP estimation), which sends a PING whenever data arrives and none is
// outstanding, i.e. about one per round trip on a busy connection; 1 MiB
// never limits RateLimitRequests (a few hundred bytes each).
const grpcWindow = 1 << 20

// grpcKeepaliveMinTime is the shortest interval between client keepalive
// pings the gRPC server tolerates (keepalive.EnforcementPolicy.MinTime): a
// client pinging more often gets GOAWAY ("too_many_pings") and its
// connection closed. Envoy sends no keepalive pings unless its cluster
// sets connection_keepalive, whose interval is far longer.
const grpcKeepaliveMinTime = 10 * time.Second

// grpcServerOptions are the transport options of the gRPC server, chosen
// for many small unary calls on few long-lived connections (Envoy's
// pattern; see BENCHMARKS.md, "CPU per decision"), and its resource
// bounds (docs/security.md, "Resource bounds"): --grpc-max-recv-msg-size
// (a larger message fails with ResourceExhausted before it is decoded),
// --grpc-max-concurrent-streams (advertised in SETTINGS; a client opening
// more is refused with REFUSED_STREAM, grpc-go clients wait instead), and
// a keepalive enforcement policy (pings at most every
// grpcKeepaliveMinTime, also on idle connections), and the connection age
// (--grpc-max-connection-age, --grpc-max-connection-age-grace): after
// the age, ±10% jitter added by grpc-go, the connection is sent GOAWAY,
// new calls go to a new connection (which Envoy balances over the current
// endpoints) and calls in flight run on for at most the grace. 0 leaves
// grpc-go's default, infinity, for either.
func grpcServerOptions(o Options) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(grpcStreamWorkers),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
		grpc.MaxRecvMsgSize(o.GRPCMaxRecvMsgSize),
		grpc.MaxConcurrentStreams(uint32(o.GRPCMaxConcurrentStreams)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcKeepaliveMinTime, PermitWithoutStream: true}),
		// Time and Timeout stay 0: grpc-go's server pings (2 h, 20 s).
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      o.GRPCMaxConnectionAge,
			MaxConnectionAgeGrace: o.GRPCMaxConnectionAgeGrace,
		}),
	}
}

// limitConns returns l, or for max > 0 l accepting at most max connections
// at once (--grpc-max-connections): beyond it Accept waits until one
// closes, so a further client's TCP handshake completes in the kernel's
// backlog but its HTTP/2 handshake waits (its calls run into their
// deadlines).
func limitConns(l net.Listener, max int) net.Listener {
	if max <= 0 {
		return l
	}
	return netutil.LimitListener(l, max)
}

// httpMaxHeaderBytes bounds the request line and headers an HTTP listener
// reads (http.Server.MaxHeaderBytes), 64 KiB: /json, /healthcheck and
// /metrics need none beyond a few standard ones. A larger header section
// gets 431.
const httpMaxHeaderBytes = 64 << 10

// newHTTPServer returns an HTTP server for h bounded as documented in
// docs/security.md, "Resource bounds": the request headers must arrive
// within --http-read-timeout (ReadHeaderTimeout and ReadTimeout), the
// response be written within --http-write-timeout when write is true
// (false for the debug listener, whose CPU profiles and traces last as
// long as asked), a keep-alive connection is closed after
// --http-idle-timeout without a request, and headers beyond
// httpMaxHeaderBytes are refused.
func newHTTPServer(o Options, h http.Handler, write bool) *http.Server {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: o.HTTPReadTimeout,
		ReadTimeout:       o.HTTPReadTimeout,
		IdleTimeout:       o.HTTPIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
	}
	if write {
		hs.WriteTimeout = o.HTTPWriteTimeout
	}
	return hs
}
