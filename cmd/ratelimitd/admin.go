package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The admin API (docs/admin.md) and the operational events: explain and
// reset on the debug listener only (HTTP JSON and the gRPC service
// ratelimitd.admin.v1.Admin, both behind debugGuard), the circuit
// breaker's transitions as log lines and
// ratelimitd_backend_circuit_transitions_total, and ratelimitd_build_info.
//
// The admin gRPC service is not registered on the main gRPC listener:
// every Envoy that listener admits could read and reset every counter,
// whereas the debug listener admits loopback connections and holders of
// --debug-token-file only.

// validateDecisionLog checks --log-decisions and --log-decisions-rate.
func (o Options) validateDecisionLog() error {
	if _, err := service.ParseDecisionLogMode(o.LogDecisions); err != nil {
		return fmt.Errorf("--log-decisions=%s: want off, denied or all", o.LogDecisions)
	}
	if !(o.Service.DecisionLogRate > 0) {
		// 0 would be service's default: the flag's rule is stated here.
		return fmt.Errorf("--log-decisions-rate=%v: must be > 0 (lines per second)", o.Service.DecisionLogRate)
	}
	return nil
}

// decisionLog maps the flags onto service.Options (validated).
func decisionLog(o Options) (service.DecisionLogMode, float64, bool) {
	m, _ := service.ParseDecisionLogMode(o.LogDecisions)
	return m, o.Service.DecisionLogRate, o.KeyValues == "clear"
}

// events turns backend state changes into log lines and metrics. It is
// created before the store (whose breaker calls it) and registered once
// the registry exists.
type events struct {
	log     *slog.Logger
	backend string
	circuit *prometheus.CounterVec // to
}

func newEvents(log *slog.Logger, backend string) *events {
	return &events{log: log, backend: backend, circuit: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimitd_backend_circuit_transitions_total",
		Help: "Backend (Redis, memcached with one server) circuit breaker state changes by the state entered (open, half_open, closed).",
	}, []string{"to"})}
}

// register registers the event metrics and ratelimitd_build_info on reg.
func (e *events) register(reg prometheus.Registerer) error {
	bi := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ratelimitd_build_info",
		Help: "1, labelled with the build's version and commit (set by the Makefile's -ldflags; \"dev\" otherwise) and Go version.",
	}, []string{"version", "commit", "goversion"})
	bi.WithLabelValues(version, commit, runtime.Version()).Set(1)
	for _, c := range []prometheus.Collector{bi, e.circuit} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// onCircuit is the backend breaker's OnTransition (Redis, memcached):
// one count per state change. The log lines are onReport's.
func (e *events) onCircuit(to redis.BreakerState) {
	e.circuit.WithLabelValues(to.String()).Inc()
}

// onReport is the backend breaker's OnReport: one log line when the
// circuit opens, one when it closes, each with the half-open probes that
// failed meanwhile, and while it stays open one line per
// redis.DefaultBreakerReportEvery at most, rather than one per probe.
func (e *events) onReport(r redis.BreakerReport) {
	switch {
	case r.To == redis.BreakerClosed:
		e.log.Info("backend circuit closed: a probe succeeded, calls go to the backend again",
			"backend", e.backend, "circuit", r.To.String(), "failed_probes", r.FailedProbes, "open_for", time.Since(r.Since).Round(time.Millisecond).String())
	case r.Still:
		e.log.Warn("backend circuit still open: probes keep failing; decisions get the rules' failure modes",
			"backend", e.backend, "circuit", r.To.String(), "failed_probes", r.FailedProbes, "open_for", time.Since(r.Since).Round(time.Millisecond).String())
	default:
		e.log.Warn("backend circuit opened: calls fail fast and decisions get the rules' failure modes until a probe succeeds", "backend", e.backend, "circuit", r.To.String())
	}
}

// adminGRPC is the gRPC server of the admin service, served through the
// debug listener's HTTP handler (HTTP/2 without TLS, as grpc clients
// speak it with insecure credentials), with reflection.
func adminGRPC(o Options, svc *service.Service) (*grpc.Server, error) {
	g := grpc.NewServer(grpc.MaxRecvMsgSize(o.GRPCMaxRecvMsgSize))
	if err := svc.RegisterAdmin(g); err != nil {
		return nil, err
	}
	reflection.Register(g)
	return g, nil
}

// withGRPC sends gRPC requests (HTTP/2, Content-Type application/grpc)
// to g and everything else to h.
func withGRPC(h http.Handler, g *grpc.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g != nil && r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// debugProtocols lets the debug listener speak HTTP/1.1 and, for the
// admin gRPC service, HTTP/2 with prior knowledge (no TLS).
func debugProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// withDecisionLog returns so with the decision log options of o.
func withDecisionLog(so service.Options, o Options) service.Options {
	so.DecisionLog, so.DecisionLogRate, so.LogValues = decisionLog(o)
	return so
}

// debugServer is the debug listener's server: debugMux and the admin gRPC
// service, behind debugGuard. Stop the gRPC server after the HTTP server.
func (s *server) debugServer() (*http.Server, *grpc.Server, error) {
	g, err := adminGRPC(s.opts, s.svc)
	if err != nil {
		return nil, nil, err
	}
	hs := newHTTPServer(s.opts, debugGuard(withGRPC(s.debugMux(), g), s.opts.DebugTokenFile, s.log), false)
	hs.Protocols = debugProtocols()
	return hs, g, nil
}
