package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ratelimitd/ratelimitd/internal/events"
	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// logStartup writes the first log lines: version and config source, the
// mode in force and why, the GC policy (applied here), the startup
// warnings, and the warnings about risky settings.
func logStartup(log *slog.Logger, o serveopts.Options, gc gcpolicy.Policy, warnings []string) {
	if o.ConfigSource == "xds" {
		log.Info("starting ratelimitd", "version", version, "commit", commit, "backend", o.Backend, "config_source", "xds", "xds_server", secrets.Redact(secrets.Address, o.XDS.ServerURL), "xds_node_id", o.XDS.NodeID)
	} else {
		log.Info("starting ratelimitd", "version", version, "commit", commit, "backend", o.Backend, "config", o.Config)
	}
	msg, attrs := o.ModeLog()
	log.Info(msg, attrs...)
	gc.Apply()
	gc.Log(log)
	for _, w := range warnings {
		log.Warn(w)
	}
	if o.Backend == "redis" && o.Redis.Timeout >= envoyFilterTimeout {
		log.Warn("--redis-timeout is not below Envoy's default rate-limit filter timeout: with Redis frozen, a call's budget (Envoy's deadline less --redis-deadline-margin) runs out before Redis has been silent for --redis-timeout, so the per-rule failure modes cannot tell a dead Redis (failure_mode open requests then get DeadlineExceeded and Envoy's own failure_mode_deny decides); keep it well under the filter's timeout",
			"redis_timeout", o.Redis.Timeout.String(), "envoy_default_timeout", envoyFilterTimeout.String())
	}
	if o.KeyValues == "clear" {
		log.Warn("--key-values=clear: descriptor values are stored in clear text in backend keys (development only)")
	}
}

// newTelemetry sets up tracing (flushed by release), the Prometheus
// registry with the Go, process, backend and event metrics, and the
// statsd client of --statsd-addr (flushed and closed by release).
func (s *server) newTelemetry(ev *events.Events) error {
	o := s.opts
	tr, err := telemetry.Setup(context.Background(), serveopts.TelemetryOptions(o))
	if err != nil {
		return err
	}
	s.tracing = tr
	s.onClose(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(sctx); err != nil {
			s.log.Warn("flushing traces", "err", err)
		}
	})
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := registerBackendMetrics(s.reg, s.store); err != nil {
		return fmt.Errorf("backend metrics: %w", err)
	}
	if err := registerDurableMetrics(s.reg, s.durable); err != nil {
		return err
	}
	if err := registerMemoryMetrics(s.reg, s.store, s.fallback); err != nil {
		return fmt.Errorf("memory store metrics: %w", err)
	}
	if err := ev.Register(s.reg, version, commit); err != nil {
		return fmt.Errorf("event metrics: %w", err)
	}
	sc, stopStatsd, err := startStatsd(o, s.reg, s.log)
	if err != nil {
		return err
	}
	s.statsd = sc
	s.onClose(stopStatsd)
	addLocalCacheStats(sc, s.store)
	return nil
}

// startStatsd starts the statsd client of --statsd-addr (nil, and a no-op
// stop, without it): envoyproxy/ratelimit's stats, its Go runtime stats
// under "ratelimit.go", and ratelimitd_statsd_* on reg. stop flushes once
// more and closes the socket; call it after the servers stopped.
func startStatsd(o serveopts.Options, reg prometheus.Registerer, log *slog.Logger) (*statsd.Client, func(), error) {
	if o.StatsdAddr == "" {
		return nil, func() {}, nil
	}
	tags, err := serveopts.ParseStatsdTags(o.StatsdTags)
	if err != nil {
		return nil, nil, err
	}
	sc, err := statsd.New(statsd.Options{Addr: o.StatsdAddr, FlushInterval: o.StatsdFlushInterval, Registerer: reg, Logger: log, Tags: tags})
	if err != nil {
		return nil, nil, err
	}
	sc.AddRuntimeStats("ratelimit.go")
	log.Info("sending statsd", "addr", secrets.Redact(secrets.Address, o.StatsdAddr), "flush_interval", o.StatsdFlushInterval.String())
	return sc, sc.Start(), nil
}
