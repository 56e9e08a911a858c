// Health: what decisions and the background probe learn about
// PostgreSQL.

package postgres

import (
	"context"
	"errors"
	"time"
)

// Healthy reports whether decisions are counted now: false from a
// definite outage error (refused, connection lost, read-only, credentials
// refused, schema gone) of a decision or the probe until the next
// success, while the circuit breaker is not closed (timeouts of a whole
// Timeout count there, as consecutive failures), and until the schema is
// checked (see New). A caller's deadline that ran out, or a probe that
// ran out of time while PostgreSQL was answering, says nothing of
// PostgreSQL and changes nothing. Implements service.Healther.
func (s *Store) Healthy() bool {
	return s.ready.Load() && !s.unhealthy.Load() && s.breaker.Healthy()
}

// HealthCause is the cause and the error of the latest outage the Store
// saw (a decision's or the probe's, or the failure to connect at New):
// why it is not healthy, or was not until it became healthy again. The
// error never holds the password. Both are zero when none was seen.
func (s *Store) HealthCause() (cause string, err error) {
	if !s.ready.Load() {
		if e := s.lastOutage.Load(); e != nil {
			return e.Cause(), e
		}
		if e := s.notReady.Load(); e != nil {
			return e.Cause(), e
		}
	}
	if e := s.lastOutage.Load(); e != nil {
		return e.Cause(), e
	}
	return "", nil
}

// note records the outcome of a decision or probe for Healthy. Only a
// definite outage makes the Store unhealthy at once; a timeout is left to
// the breaker, which opens after consecutive ones over FailFor. A refused
// connection also drops the pool's idle connections: they point at a
// server that is gone, and each would fail one call after it is back.
func (s *Store) note(err error) {
	if err == nil {
		if s.unhealthy.Load() {
			s.unhealthy.Store(false)
		}
		return
	}
	var e *Error
	if errors.As(err, &e) && e.Cause() == CauseSchema {
		// A decision found the table or function missing: have the
		// probe check the schema now rather than after HealthInterval.
		s.wakeProbe()
	}
	if errors.As(err, &e) && e.Outage() {
		s.lastOutage.Store(e)
		if e.Cause() == CauseTimeout {
			return
		}
		if err == errSchemaGone && !s.unhealthy.Load() {
			s.log.Error("durable store: the schema is gone; durable limits get their failure modes until it is recreated", "err", err)
		}
		s.unhealthy.Store(true)
		if e.Cause() == CauseRefused {
			s.pool.Reset()
		}
		// Wake the probe, which may be waiting a whole HealthInterval:
		// from then on it probes every unhealthyProbeInterval.
		s.wakeProbe()
	}
}

func (s *Store) wakeProbe() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// errProbeSlow is the probe's error when it ran out of time while
// PostgreSQL answered decisions meanwhile: the host was too slow (CPU
// starvation, a throttled pod), PostgreSQL was not gone. Neither an
// outage nor a stall.
var errProbeSlow = newError(CauseTimeout, false, errors.New("health probe not finished in time while PostgreSQL was answering"))

// errStandby is the probe's error when the server is a standby: it
// answers but refuses writes.
var errStandby = newError(CauseReadOnly, true, errors.New("the server is a standby (pg_is_in_recovery)"))

// probeTimeout is the least budget of a probe: it runs in the
// background, so it may wait longer than a decision for a server that is
// resuming (a fresh connection, authentication, a backlog of others), and
// a probe that succeeds as soon as the server answers closes the breaker
// sooner than one that gave up and waits out another OpenFor.
const probeTimeout = 500 * time.Millisecond

// errSchemaGone is the probe's error when a table, index or function of
// the schema is missing (dropped, or a restore without it, after New
// migrated): decisions would fail, so the store is not healthy until
// repairSchema recreates it.
var errSchemaGone = newError(CauseSchema, true, errors.New("a ratelimitd_* table or function is missing; recreating the schema"))

// probeSQL asks whether the server is a primary and holds every object
// of the schema.
var probeSQL = "SELECT pg_is_in_recovery(), cardinality(" + missingSQL + ") = 0"

// probe asks the server whether it is a primary and still holds the
// schema, within max(Timeout, probeTimeout).
func (s *Store) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(s.opts.Timeout, probeTimeout))
	defer cancel()
	var standby, schema bool
	err := s.pool.QueryRow(ctx, probeSQL).Scan(&standby, &schema)
	if err != nil {
		if ctx.Err() != nil {
			return errTimeout
		}
		return classify(err, s.secrets)
	}
	if standby {
		return errStandby
	}
	if !schema {
		return errSchemaGone
	}
	return nil
}

// check is the probe, and when it finds the schema gone, repairSchema.
func (s *Store) check(ctx context.Context) error {
	err := s.probe(ctx)
	if err != errSchemaGone {
		return err
	}
	s.note(err)
	return s.repairSchema(ctx)
}

// repairSchema runs migrate (which recreates the missing objects under
// the advisory lock, as at New) within ConnectTimeout. A failure (such
// as a user without the CREATE privilege) is logged at error level once
// until a repair succeeds, and keeps errSchemaGone.
func (s *Store) repairSchema(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.ConnectTimeout)
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := s.migrate(ctx); err != nil {
		if !s.repairFailed.Swap(true) {
			s.log.Error("durable store: cannot recreate the schema; durable limits get their failure modes until it is recreated", "err", err)
		}
		return errSchemaGone
	}
	s.repairFailed.Store(false)
	return nil
}

func (s *Store) probeLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		if !s.ready.Load() {
			// connectLoop is trying; a probe would be a second login.
			select {
			case <-s.stop:
				return
			case <-s.connected:
			}
			continue
		}
		// While the circuit is closed the probe runs beside the breaker
		// (only decisions open it); while it is not, through it: refused
		// while open, a half-open probe after OpenFor that closes it when
		// the server answers, so that an idle Store recovers.
		var err error
		if s.breaker.Healthy() {
			at, start := s.clk.Now(), time.Now()
			err = s.check(context.Background())
			if errors.Is(err, errTimeout) {
				// A probe that ran out of time while decisions were
				// answered meanwhile is a slow (starved) host, not an
				// outage; otherwise it counts as a stall toward the
				// breaker, as a decision's Timeout does.
				if s.answered.Load() >= start.UnixNano() {
					err = errProbeSlow
				}
				s.breaker.RecordSince(at, s.clk.Now(), err)
			}
		} else {
			err = s.breaker.Do(context.Background(), 0, s.check)
		}
		s.note(err)
		d := s.opts.HealthInterval
		if err != nil || !s.breaker.Healthy() {
			d = min(d, unhealthyProbeInterval)
		}
		wake := s.wake
		if backoff = retryAfter(err, backoff); backoff > unhealthyProbeInterval {
			// A refused login or failed TLS: back off, and let no
			// decision's error wake the probe meanwhile.
			d, wake = backoff, nil
		} else {
			backoff = 0
		}
		if !s.wait(d, wake) {
			return
		}
	}
}

// wait waits d of the Store's clock, or less when wake receives (nil
// never does); it reports false, early, when the Store is closed.
func (s *Store) wait(d time.Duration, wake <-chan struct{}) bool {
	t := s.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.stop:
		return false
	case <-wake:
		return true
	case <-t.C():
		return true
	}
}
