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

// connectLoop retries migrate every unhealthyProbeInterval (backing off
// after an auth or TLS error, see retryAfter), each attempt within
// ConnectTimeout, until it succeeds (then the Store is ready) or the
// Store is closed. first is the error of New's attempt, already logged: a
// failure is logged when its cause changes, a newer schema at error
// level, since only an operator can end it.
func (s *Store) connectLoop(first error) {
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
	logged := causeLabel(first)
	d := retryAfter(first, 0)
	for s.wait(d, nil) {
		actx, acancel := context.WithTimeout(ctx, s.opts.ConnectTimeout)
		err := s.migrate(actx)
		if err != nil && actx.Err() != nil && ctx.Err() == nil {
			err = errTimeout
		}
		acancel()
		if err == nil {
			s.setReady()
			s.log.Info("durable store: PostgreSQL answered and the schema is checked; durable decisions are counted", "version", SchemaVersion)
			return
		}
		if ctx.Err() != nil {
			return
		}
		d = retryAfter(err, d)
		e := notConnected(err)
		s.notReady.Store(e)
		var oe *Error
		if errors.As(err, &oe) {
			s.lastOutage.Store(oe)
		}
		cause := causeLabel(err)
		if cause == logged {
			continue
		}
		logged = cause
		if cause == CauseSchema {
			s.log.Error("durable store: the database's schema is not usable by this binary; durable limits get their failure modes until an operator fixes it", "cause", cause, "err", err)
			continue
		}
		s.log.Warn("durable store: "+connectAdvice(cause), "cause", cause, "err", err)
	}
}

// connectAdvice is what the log says of a failure of cause to reach
// PostgreSQL: what an operator checks.
func connectAdvice(cause string) string {
	switch cause {
	case CauseAuth:
		return "PostgreSQL refused the login (check the URL's user and database, the password, pg_hba.conf); retrying with backoff up to 30 s"
	case CauseTLS:
		return "TLS with PostgreSQL failed (check the URL's sslmode and sslrootcert against the server's ssl setting and certificate); retrying with backoff up to 30 s"
	}
	return "still cannot reach PostgreSQL and check its schema; retrying"
}

// causeLabel is err's cause (CauseOther for an error that is not *Error).
func causeLabel(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Cause()
	}
	return CauseOther
}

// setReady marks the schema checked: Take counts decisions and the probe
// loop starts probing.
func (s *Store) setReady() {
	s.ready.Store(true)
	close(s.connected)
}
