package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/ratelimitd/ratelimitd/internal/boundary"
	"github.com/ratelimitd/ratelimitd/internal/listen"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
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
// interceptor, the transport options and bounds (listen.GRPC),
// tracing, TLS (reloaded on change), --grpc-max-connections, and the RLS,
// RLQS, health and reflection services.
func (s *server) newGRPCServer() error {
	o := s.opts
	gopts := append([]grpc.ServerOption{s.svc.ServerOption()}, grpcLimits(o).ServerOptions()...)
	if ic := s.svc.UnaryServerInterceptor(); ic != nil {
		gopts = append(gopts, grpc.ChainUnaryInterceptor(ic))
	}
	if o.Telemetry.Enabled {
		// With tracing off the otelgrpc stats handler would only start
		// no-op spans, which cost CPU on every call (BENCHMARKS.md, "CPU
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
	s.grpcLn = listen.LimitConns(s.grpcLn, o.GRPCMaxConnections)
	g := grpc.NewServer(gopts...)
	s.svc.Register(g)
	if s.rlqs != nil {
		s.rlqs.Register(g)
	}
	healthpb.RegisterHealthServer(g, s.health)
	reflection.Register(g)
	s.servers.GRPC, s.servers.GRPCListener = g, s.grpcLn
	return nil
}

// newHTTPServers builds the HTTP server (/healthcheck, /livez, /json
// behind its trust boundary, /metrics; TLS with --http-tls), the debug
// server and the metrics-only server when their listeners are open.
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
	// /livez answers whenever the process serves HTTP: no config, a cold
	// backend or a drain leave it 200, so a liveness probe on it restarts
	// only a process that stopped answering, never one waiting for a good
	// config (readiness is /healthcheck or the gRPC health).
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "OK")
	})
	s.json = boundary.JSONOf(tlsOf(s.opts))
	mux.Handle("/json", s.json.Guard(s.svc.JSONHandler()))
	mux.Handle("/metrics", metrics)
	hs := httpLimits(s.opts).Server(mux, true)
	if s.opts.HTTPTLS {
		var err error
		if hs.TLSConfig, err = tlsOf(s.opts).HTTPConfig(s.log); err != nil {
			return err
		}
	}
	sv := &s.servers
	sv.HTTP, sv.HTTPListeners = []*http.Server{hs}, []net.Listener{s.httpLn}
	if s.debugLn != nil {
		ds, adminGS, err := s.debugServer()
		if err != nil {
			return err
		}
		s.onClose(adminGS.Stop)
		sv.HTTP, sv.HTTPListeners = append(sv.HTTP, ds), append(sv.HTTPListeners, s.debugLn)
	}
	if s.metricsLn != nil {
		mm := http.NewServeMux()
		mm.Handle("/metrics", metrics)
		sv.HTTP, sv.HTTPListeners = append(sv.HTTP, httpLimits(s.opts).Server(mm, true)), append(sv.HTTPListeners, s.metricsLn)
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

// grpcLimits are the gRPC server's bounds of o.
func grpcLimits(o serveopts.Options) listen.GRPC {
	return listen.GRPC{MaxRecvMsgSize: o.GRPCMaxRecvMsgSize, MaxConcurrentStreams: o.GRPCMaxConcurrentStreams,
		MaxConnectionAge: o.GRPCMaxConnectionAge, MaxConnectionAgeGrace: o.GRPCMaxConnectionAgeGrace}
}

// httpLimits are the HTTP servers' bounds of o.
func httpLimits(o serveopts.Options) listen.HTTP {
	return listen.HTTP{ReadTimeout: o.HTTPReadTimeout, WriteTimeout: o.HTTPWriteTimeout, IdleTimeout: o.HTTPIdleTimeout}
}

// debugServer is the debug listener's server and its admin gRPC server
// (listen.Debug). Stop the gRPC server after the HTTP server.
func (s *server) debugServer() (*http.Server, *grpc.Server, error) {
	return listen.Debug{Service: s.svc, Args: os.Args, KindOf: serveopts.SecretKindOf, TokenFile: s.opts.DebugTokenFile,
		MaxRecvMsgSize: s.opts.GRPCMaxRecvMsgSize, HTTP: httpLimits(s.opts), Log: s.log}.Server()
}

// tlsOf is the TLS material of the gRPC listener (and of the HTTP listener
// with --http-tls).
func tlsOf(o serveopts.Options) boundary.TLS {
	return boundary.TLS{Cert: o.GRPCTLSCert, Key: o.GRPCTLSKey, ClientCA: o.GRPCTLSClientCA, ClientSAN: o.GRPCTLSClientSAN, HTTP: o.HTTPTLS}
}
