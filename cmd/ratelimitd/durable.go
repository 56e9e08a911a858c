package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// durableHealth is the gRPC health service name of the durable store
// (service.Healther), reported apart from the fast backend's
// (backendHealth): a PostgreSQL outage gives the durable limits their
// failure modes and leaves the service SERVING.
const durableHealth = "ratelimitd.durable"

// durableOptions maps the --durable-* flags onto postgres.Options
// (validated by postgres.New); password is --durable-password-file's
// content ("" without it).
func durableOptions(o Options, password string) postgres.Options {
	po := postgres.DefaultOptions()
	po.URL = o.DurableURL
	po.Password = password
	po.Timeout = o.DurableTimeout
	po.MaxConns = int32(min(o.DurableMaxConns, 1<<30))
	return po
}

// newDurable connects the durable store of --durable-url (nothing
// without it), waiting up to --durable-connect-timeout for PostgreSQL
// and its schema, and has release close it.
func (s *server) newDurable() error {
	o := s.opts
	if o.DurableURL == "" {
		return nil
	}
	password := ""
	if o.DurablePasswordFile != "" {
		var err error
		if password, err = readSecretFile("durable-password-file", o.DurablePasswordFile); err != nil {
			return err
		}
	}
	po := durableOptions(o, password)
	po.Logger = s.log
	ctx, cancel := context.WithTimeout(context.Background(), o.DurableConnect)
	defer cancel()
	st, err := postgres.New(ctx, po)
	if err != nil {
		return scrubErr(fmt.Errorf("durable store %s: %w", postgres.RedactURL(o.DurableURL), err), append(secretsOf(o), password)...)
	}
	s.durable, s.durableRaw = asStore(st), st
	attrs := []any{"url", postgres.RedactURL(o.DurableURL), "timeout", o.DurableTimeout.String(), "max_conns", po.MaxConns}
	if o.DurablePasswordFile != "" {
		attrs = append(attrs, "password_file", o.DurablePasswordFile)
	}
	s.log.Info("durable store", attrs...)
	s.onClose(func() {
		if err := st.Close(); err != nil {
			s.log.Warn("closing durable store", "err", err)
		}
	})
	return nil
}

// updateDurableHealth sets the gRPC health of durableHealth from the
// durable store's Healthy, and logs its transitions once each.
func (s *server) updateDurableHealth() {
	h, ok := s.durableRaw.(service.Healther)
	if !ok {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	up := h.Healthy()
	if up && !s.stopping.Load() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(durableHealth, st)
	want := backendDown
	if up {
		want = backendUp
	}
	if s.durableLogged.Swap(want) == want {
		return
	}
	if up {
		s.log.Info("durable store healthy: durable decisions are counted")
		return
	}
	s.log.Warn("durable store unhealthy: durable limits get their failure modes until it answers again")
}

// registerDurableMetrics exports what the durable store reports about
// itself: ratelimitd_durable_up, its circuit breaker's state and the
// expired rows its sweeper deleted. Nothing without a durable store.
func registerDurableMetrics(reg prometheus.Registerer, store any) error {
	if store == nil {
		return nil
	}
	var cs []prometheus.Collector
	if h, ok := store.(service.Healther); ok {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimitd_durable_up",
			Help: "1 while the durable store (PostgreSQL) counts decisions, 0 while its limits get their failure modes.",
		}, func() float64 {
			if h.Healthy() {
				return 1
			}
			return 0
		}))
	}
	if b, ok := store.(breakerStater); ok {
		for _, st := range breakerStates {
			cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "ratelimitd_durable_circuit_state",
				Help:        "Circuit breaker in front of the durable store: 1 for the current state (closed, open, half_open), else 0.",
				ConstLabels: prometheus.Labels{"state": st},
			}, func() float64 {
				if b.BreakerState() == st {
					return 1
				}
				return 0
			}))
		}
	}
	if sw, ok := store.(interface {
		Swept() uint64
		SweepErrors() uint64
	}); ok {
		cs = append(cs,
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimitd_durable_swept_rows_total", Help: "Expired durable counters deleted by the sweeper (in bounded batches)."}, func() float64 { return float64(sw.Swept()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimitd_durable_sweep_errors_total", Help: "Sweeper batches that failed; expired rows stay until a later batch deletes them."}, func() float64 { return float64(sw.SweepErrors()) }))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// asStore is st as a service.Store: st itself, or, for a store whose Take
// still returns its decisions (Take(ctx, hits) ([]algo.Decision, error)),
// st behind takeInto; nil for anything else.
func asStore(st any) service.Store {
	switch v := st.(type) {
	case service.Store:
		return v
	case returningTaker:
		return takeInto{v}
	}
	return nil
}

// returningTaker is a Take that returns its decisions.
type returningTaker interface {
	Take(ctx context.Context, hits []algo.Hit) ([]algo.Decision, error)
}

// takeInto adapts a returningTaker to service.Store: the decisions are
// copied into the caller's array, and a count other than len(hits) is an
// error. The store's optional interfaces (health, breaker state,
// algorithms, sweeper counts) stay reachable through Unwrap.
type takeInto struct{ returningTaker }

func (t takeInto) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	res, err := t.returningTaker.Take(ctx, hits)
	if err != nil {
		return err
	}
	if len(res) != len(hits) {
		return fmt.Errorf("durable store: %d decisions for %d hits", len(res), len(hits))
	}
	copy(out, res)
	return nil
}

// Unwrap returns the adapted store.
func (t takeInto) Unwrap() any { return t.returningTaker }
