// Package events reports the operational events of `ratelimitd serve`:
// the backend circuit breaker's transitions as log lines and
// ratelimitd_backend_circuit_transitions_total, and ratelimitd_build_info.
package events

import (
	"log/slog"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// Events turns backend state changes into log lines and metrics. It is
// created before the store (whose breaker calls it) and registered once
// the registry exists.
type Events struct {
	log     *slog.Logger
	backend string
	circuit *prometheus.CounterVec // to
}

// New returns the events of the store of backend ("redis", "memcache",
// ...), logged to log.
func New(log *slog.Logger, backend string) *Events {
	return &Events{log: log, backend: backend, circuit: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimitd_backend_circuit_transitions_total",
		Help: "Backend (Redis, memcached with one server) circuit breaker state changes by the state entered (open, half_open, closed).",
	}, []string{"to"})}
}

// Register registers the event metrics and ratelimitd_build_info, labelled
// with version and commit, on reg.
func (e *Events) Register(reg prometheus.Registerer, version, commit string) error {
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

// OnCircuit is the backend breaker's OnTransition (Redis, memcached):
// one count per state change. The log lines are OnReport's.
func (e *Events) OnCircuit(to redis.BreakerState) {
	e.circuit.WithLabelValues(to.String()).Inc()
}

// OnReport is the backend breaker's OnReport: one log line when the
// circuit opens, one when it closes, each with the half-open probes that
// failed meanwhile, and while it stays open one line per
// redis.DefaultBreakerReportEvery at most, rather than one per probe.
// open_for is measured on the breaker's clock (Report.OpenFor), the one
// its Since was read from.
//
// Each line names the node whose circuit it is when the backend says
// (Report.Node: a Redis master's address, one of many on Cluster), and a
// line of a circuit opening says why: cause (the bounded label of the
// error that opened it; "stalled" for a request left unanswered) and
// that error.
func (e *Events) OnReport(r redis.BreakerReport) {
	attrs := []any{"backend", e.backend, "circuit", r.To.String()}
	if r.Node != "" {
		attrs = append(attrs, "node", r.Node)
	}
	if r.To == redis.BreakerOpen {
		if r.Err != nil {
			attrs = append(attrs, "cause", redis.CauseOf(r.Err), "error", r.Err.Error())
		} else {
			attrs = append(attrs, "cause", redis.CauseStalled, "error", "a request unanswered, nothing received from the node")
		}
	}
	switch {
	case r.To == redis.BreakerClosed:
		e.log.Info("backend circuit closed: a probe succeeded, calls go to the backend again",
			append(attrs, "failed_probes", r.FailedProbes, "open_for", r.OpenFor().Round(time.Millisecond).String())...)
	case r.Still:
		e.log.Warn("backend circuit still open: probes keep failing; decisions get the rules' failure modes",
			append(attrs, "failed_probes", r.FailedProbes, "open_for", r.OpenFor().Round(time.Millisecond).String())...)
	default:
		e.log.Warn("backend circuit opened: calls fail fast and decisions get the rules' failure modes until a probe succeeds", attrs...)
	}
}
