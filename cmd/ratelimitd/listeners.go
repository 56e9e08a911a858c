package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/ratelimitd/ratelimitd/internal/boundary"
	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// openListeners binds the gRPC, HTTP and (when set) debug and metrics
// addresses; release closes them.
func (s *server) openListeners() error {
	o := s.opts
	var lns []net.Listener
	s.onClose(func() {
		for _, l := range lns {
			_ = l.Close()
		}
	})
	for _, l := range []struct {
		name, addr string
		dst        *net.Listener
	}{{"grpc", o.GRPCAddr, &s.grpcLn}, {"http", o.HTTPAddr, &s.httpLn}, {"debug", o.DebugAddr, &s.debugLn}, {"metrics", o.MetricsAddr, &s.metricsLn}} {
		if l.addr == "" {
			continue // debug and metrics only: the others are required
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			return fmt.Errorf("%s listener: %w", l.name, err)
		}
		lns = append(lns, ln)
		*l.dst = ln
	}
	return nil
}

// newGRPCServer builds the gRPC server: the service's codec and
// interceptor, the transport options and bounds (grpcServerOptions),
// tracing, TLS (reloaded on change), --grpc-max-connections, and the RLS,
// RLQS, health and reflection services.
func (s *server) newGRPCServer() error {
	o := s.opts
	gopts := append([]grpc.ServerOption{s.svc.ServerOption()}, grpcServerOptions(o)...)
	if ic := s.svc.UnaryServerInterceptor(); ic != nil {
		gopts = append(gopts, grpc.ChainUnaryInterceptor(ic))
	}
	if o.Tracing {
		// With tracing off the otelgrpc stats handler would only start
		// no-op spans, at ~1-2 µs of CPU per call (BENCHMARKS.md, "CPU
		// per decision").
		gopts = append(gopts, s.tracing.ServerOption())
	}
	if o.GRPCTLSCert != "" {
		tc, err := tlsOf(o).GRPCConfig(s.log)
		if err != nil {
			return err
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.grpcLn = limitConns(s.grpcLn, o.GRPCMaxConnections)
	s.grpc = grpc.NewServer(gopts...)
	s.svc.Register(s.grpc)
	if s.rlqs != nil {
		s.rlqs.Register(s.grpc)
	}
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	return nil
}

// newHTTPServers builds the HTTP server (/healthcheck, /json behind its
// trust boundary, /metrics; TLS with --http-tls), the debug server and
// the metrics-only server when their listeners are open.
func (s *server) newHTTPServers() error {
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg})
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, r *http.Request) {
		if !s.serving() {
			http.Error(w, "NOT SERVING", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "OK")
	})
	s.json = boundary.JSONOf(tlsOf(s.opts))
	mux.Handle("/json", s.json.Guard(s.svc.JSONHandler()))
	mux.Handle("/metrics", metrics)
	hs := newHTTPServer(s.opts, mux, true)
	if s.opts.HTTPTLS {
		var err error
		if hs.TLSConfig, err = tlsOf(s.opts).HTTPConfig(s.log); err != nil {
			return err
		}
	}
	s.https, s.httpLns = []*http.Server{hs}, []net.Listener{s.httpLn}
	if s.debugLn != nil {
		ds, adminGS, err := s.debugServer()
		if err != nil {
			return err
		}
		s.onClose(adminGS.Stop)
		s.https, s.httpLns = append(s.https, ds), append(s.httpLns, s.debugLn)
	}
	if s.metricsLn != nil {
		mm := http.NewServeMux()
		mm.Handle("/metrics", metrics)
		s.https, s.httpLns = append(s.https, newHTTPServer(s.opts, mm, true)), append(s.httpLns, s.metricsLn)
	}
	return nil
}

// logListening logs each listener's address and access.
func (s *server) logListening() {
	o := s.opts
	s.log.Info("listening", "server", "grpc", "addr", s.grpcLn.Addr().String(), "tls", o.GRPCTLSCert != "", "mtls", o.GRPCTLSClientCA != "")
	s.log.Info("listening", "server", "http", "addr", s.httpLn.Addr().String(), "tls", o.HTTPTLS, "json", s.json.Describe())
	if s.debugLn != nil {
		access := "loopback connections only"
		if o.DebugTokenFile != "" {
			access = "loopback connections, others with the bearer token of --debug-token-file"
		}
		s.log.Info("listening", "server", "debug", "addr", s.debugLn.Addr().String(), "access", access)
		if !boundary.IsLoopback(s.debugLn.Addr().String()) && o.DebugTokenFile == "" {
			s.log.Warn("debug listener bound beyond loopback without --debug-token-file: it answers 403 to every non-loopback connection", "addr", s.debugLn.Addr().String())
		}
	}
	if s.metricsLn != nil {
		s.log.Info("listening", "server", "metrics", "addr", s.metricsLn.Addr().String())
	}
}

// startServing serves every listener, each on its goroutine; a server
// that fails sends its error to s.fatal.
func (s *server) startServing() {
	s.wg.Add(1 + len(s.https))
	go func() {
		defer s.wg.Done()
		if err := s.grpc.Serve(s.grpcLn); err != nil {
			s.fatal <- fmt.Errorf("grpc server: %w", err)
		}
	}()
	for i, hs := range s.https {
		go func() {
			defer s.wg.Done()
			serveFn := hs.Serve
			if hs.TLSConfig != nil {
				serveFn = func(l net.Listener) error { return hs.ServeTLS(l, "", "") }
			}
			if err := serveFn(s.httpLns[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.fatal <- fmt.Errorf("http server: %w", err)
			}
		}()
	}
}

// stopServing stops accepting and lets in-flight calls finish within
// --shutdown-grace; gRPC calls still running then are cut, HTTP
// connections closed.
func (s *server) stopServing() {
	graceCtx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownGrace)
	defer cancel()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	var hwg sync.WaitGroup
	for _, hs := range s.https {
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
		s.log.Warn("shutdown grace expired: cutting in-flight gRPC calls")
		s.grpc.Stop()
		<-done
	}
	hwg.Wait()
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
			"POST /admin/saturation: mark a rule with reserve saturated ({\"domain\", \"rule\", \"for\"})\n"+
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
	m.Handle(service.AdminSaturationPath, admin)
	m.HandleFunc("/debug/pprof/", pprof.Index)
	m.HandleFunc("/debug/pprof/cmdline", secrets.CmdlineHandler(os.Args, secretKindOf))
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

// tlsOf is the TLS material of the gRPC listener (and of the HTTP listener
// with --http-tls).
func tlsOf(o Options) boundary.TLS {
	return boundary.TLS{Cert: o.GRPCTLSCert, Key: o.GRPCTLSKey, ClientCA: o.GRPCTLSClientCA, ClientSAN: o.GRPCTLSClientSAN, HTTP: o.HTTPTLS}
}
