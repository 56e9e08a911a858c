package main

import (
	"context"
	"fmt"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// durableHealth is the gRPC health service name of the durable store
// (service.Healther), reported apart from the fast backend's
// (backendHealth): a PostgreSQL outage gives the durable limits their
// failure modes and leaves the service SERVING.
const durableHealth = "ratelimitd.durable"

// newDurable connects the durable store of --durable-url (nothing
// without it), waiting up to --durable-connect-timeout for PostgreSQL
// and its schema, and has release close it. Only a schema newer than the
// binary (or an error of a server that answered) fails it: an
// unreachable PostgreSQL gives a store that is not healthy and connects
// in the background (postgres.New).
func (s *server) newDurable() error {
	o := s.opts
	if o.DurableURL == "" {
		return nil
	}
	password := ""
	if o.DurablePasswordFile != "" {
		var err error
		if password, err = secrets.ReadFile("durable-password-file", o.DurablePasswordFile); err != nil {
			return err
		}
	}
	po := serveopts.DurableOptions(o, password)
	po.Logger = s.log
	ctx, cancel := context.WithTimeout(context.Background(), o.DurableConnect)
	defer cancel()
	st, err := postgres.New(ctx, po)
	if err != nil {
		return secrets.ScrubErr(fmt.Errorf("durable store %s: %w", postgres.RedactURL(o.DurableURL), err), append(serveopts.Secrets(o), password)...)
	}
	s.durable = st
	attrs := []any{"url", postgres.RedactURL(o.DurableURL), "timeout", o.DurableTimeout.String(), "max_conns", po.MaxConns, "async_commit", po.AsyncCommit, "healthy", st.Healthy()}
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
	h, ok := s.durable.(service.Healther)
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
	// The cause and error of the outage that made it unhealthy, or that
	// it recovered from (the store's errors never hold the password).
	var attrs []any
	if hc, ok := s.durable.(healthCauser); ok {
		if cause, err := hc.HealthCause(); err != nil {
			attrs = append(attrs, "cause", cause, "error", err.Error())
		}
	}
	if up {
		s.log.Info("durable store healthy: durable decisions are counted", attrs...)
		return
	}
	s.log.Warn("durable store unhealthy: durable limits get their failure modes until it answers again", attrs...)
}

// healthCauser is a durable store that says why it is, or was, not
// healthy (postgres.Store.HealthCause).
type healthCauser interface {
	HealthCause() (cause string, err error)
}
