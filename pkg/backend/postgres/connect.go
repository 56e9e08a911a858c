// Connecting in the background: a Store whose PostgreSQL could not be
// reached at New keeps trying until the schema is checked.

package postgres

import (
	"context"
	"errors"
)

// ErrNotConnected is Take's error, without calling PostgreSQL, while the
// Store has not yet reached PostgreSQL and checked its schema since New
// (see New): the rules' failure modes decide.
var ErrNotConnected = newError(CauseRefused, false, errors.New("not connected: PostgreSQL has not answered and its schema is not checked yet"))

// notConnected is what Take answers after a failed attempt to reach
// PostgreSQL and check the schema: ErrNotConnected for an outage, the
// attempt's own error (a newer schema, a SQL error) otherwise.
func notConnected(err error) *Error {
	var e *Error
	if !errors.As(err, &e) || e.Outage() {
		return ErrNotConnected
	}
	return e
}

// connectLoop retries migrate every unhealthyProbeInterval, each attempt
// within ConnectTimeout, until it succeeds (then the Store is ready) or
// the Store is closed. logged is the cause last logged: a failure is
// logged when its cause changes, a newer schema at error level, since
// only an operator can end it.
func (s *Store) connectLoop(logged string) {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for s.wait(unhealthyProbeInterval, nil) {
		actx, acancel := context.WithTimeout(ctx, s.opts.ConnectTimeout)
		err := s.migrate(actx)
		if err != nil && actx.Err() != nil && ctx.Err() == nil {
			err = errTimeout
		}
		acancel()
		if err == nil {
			s.ready.Store(true)
			s.log.Info("durable store: PostgreSQL answered and the schema is checked; durable decisions are counted", "version", SchemaVersion)
			return
		}
		if ctx.Err() != nil {
			return
		}
		e := notConnected(err)
		s.notReady.Store(e)
		cause := causeLabel(err)
		if cause == logged {
			continue
		}
		logged = cause
		if cause == CauseSchema {
			s.log.Error("durable store: the database's schema is not usable by this binary; durable limits get their failure modes until an operator fixes it", "cause", cause, "err", err)
			continue
		}
		s.log.Warn("durable store: still cannot reach PostgreSQL and check its schema; retrying", "cause", cause, "err", err)
	}
}

// causeLabel is err's cause (CauseOther for an error that is not *Error).
func causeLabel(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Cause()
	}
	return CauseOther
}
