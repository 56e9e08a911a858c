package postgres

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
)

// Causes are the bounded labels of the store's errors
// (ratelimitd_backend_errors_total{cause} and the failure-mode logs).
const (
	// CauseTimeout: PostgreSQL did not answer within the call's budget
	// (a stalled or overloaded server, a lock held too long, a network
	// black hole).
	CauseTimeout = causes.Timeout
	// CauseRefused: no usable connection (refused, reset, closed, the
	// server shutting down or starting up, too many connections).
	CauseRefused = causes.Refused
	// CauseReadOnly: the server is a standby or in read-only mode (a
	// failover that left the URL on a replica).
	CauseReadOnly = "readonly"
	// CauseAuth: the server refused the login: the credentials, or the
	// database does not exist.
	CauseAuth = "auth"
	// CauseTLS: TLS with the server failed: the server does not offer it
	// (sslmode require or verify-*), or its certificate or name did not
	// verify.
	CauseTLS = "tls"
	// CauseCanceled: the caller canceled the request first.
	CauseCanceled = causes.Canceled
	// CauseCircuitOpen: the circuit breaker is open after failures the
	// server proved; PostgreSQL was not called (ErrCircuitOpen).
	CauseCircuitOpen = causes.CircuitOpen
	// CauseUnsupported: a hit of an algorithm other than fixed_window or
	// sliding_window reached the store (a wiring bug: config loading
	// refuses such rules, see Store.Algorithms).
	CauseUnsupported = "unsupported"
	// CauseSchema: the database holds no usable schema (newer than this
	// binary, or the function is missing).
	CauseSchema = "schema"
	// CauseOther: anything else (a SQL error, a result the store did not
	// expect).
	CauseOther = causes.Other
)

// Causes lists every cause label.
var Causes = []string{CauseTimeout, CauseRefused, CauseReadOnly, CauseAuth, CauseTLS, CauseCanceled, CauseCircuitOpen, CauseUnsupported, CauseSchema, CauseOther}

// Error is a classified store error. It implements service.Causer; its
// message is "postgres: <cause>: <underlying error>", with the password
// replaced by "xxxxx", and never holds a key. Outage marks the errors that
// suggest PostgreSQL is unreachable or not answering: they feed the
// breaker and make Healthy false until a call or probe succeeds.
type Error struct{ causes.Classified }

func newError(cause string, outage bool, err error) *Error {
	return &Error{causes.New("postgres", cause, outage, err)}
}

// scrubbed is an error whose message has the secrets replaced; it
// unwraps to the original so that errors.Is and errors.As still see it.
type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// classify returns err as an *Error with its cause, its message scrubbed
// of secrets; nil stays nil, an *Error is returned unchanged.
func classify(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	cause, outage := causeOf(err)
	return newError(cause, outage, &scrubbed{msg: scrub(err.Error(), secrets), err: err})
}

func causeOf(err error) (cause string, outage bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "25006": // read_only_sql_transaction
			return CauseReadOnly, true
		case pe.Code == "28P01" || pe.Code == "28000" || // invalid password, invalid authorization
			pe.Code == "3D000": // invalid_catalog_name: the URL's database does not exist
			return CauseAuth, true
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", // shutdown, crash shutdown, cannot connect now
			pe.Code == "53300": // too many connections
			return CauseRefused, true
		case pe.Code == "57014": // query_canceled: statement_timeout or our cancel
			return CauseTimeout, true
		case pe.Code == "55P03": // lock_not_available: lock_timeout on a hot key's row
			return CauseTimeout, false
		case pe.Code == "42883" || pe.Code == "42P01": // undefined function or table
			return CauseSchema, false
		}
		return CauseOther, false
	}
	if isTLS(err) {
		return CauseTLS, true
	}
	if c, outage, ok := causes.Transport(err); ok {
		return c, outage
	}
	if pgconn.Timeout(err) {
		return CauseTimeout, true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || causes.Dial(err) {
		return CauseRefused, true
	}
	if strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "closed pool") {
		return CauseRefused, true
	}
	return CauseOther, false
}

// isTLS reports whether err is a failed TLS handshake or verification,
// or the server's refusal of TLS (pgconn's "server refused TLS
// connection", which has no type).
func isTLS(err error) bool {
	var (
		ve *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		he x509.HostnameError
		ci x509.CertificateInvalidError
		rh tls.RecordHeaderError
		al tls.AlertError
	)
	return errors.As(err, &ve) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci) ||
		errors.As(err, &rh) || errors.As(err, &al) || strings.Contains(err.Error(), "server refused TLS connection")
}

// errTimeout: the call's budget ran out before PostgreSQL answered.
var errTimeout = newError(CauseTimeout, true, errors.New("no reply within the call's budget"))

// errBudgetCut is the error of a call whose budget, cut short by the
// caller's deadline, ran out, and what the breaker records for it: less
// than a whole Timeout of silence proves nothing about PostgreSQL. It is
// context.DeadlineExceeded (errors.Is), which tells the service the
// caller's time ran out (the request is undecided), where errTimeout and
// ErrStalledOpen are store failures that get the rules' failure modes.
var errBudgetCut = newError(CauseTimeout, false, fmt.Errorf("no reply within the caller's deadline: %w", context.DeadlineExceeded))

// ErrCircuitOpen is returned, without calling PostgreSQL, while the
// circuit breaker is open after failures the server proved (refused
// connections): the rules' failure modes decide.
var ErrCircuitOpen = newError(CauseCircuitOpen, false, errors.New("circuit open, not calling PostgreSQL"))

// ErrStalledOpen is returned, without calling PostgreSQL, while the
// circuit is open because the server stalled (timeouts only): its cause
// is CauseTimeout; the rules' failure modes decide.
var ErrStalledOpen = newError(CauseTimeout, false, errors.New("circuit open after PostgreSQL stalled, not calling PostgreSQL"))

// breakerErrors are the store's errors of its breaker.
var breakerErrors = breaker.Errors{Open: ErrCircuitOpen, StalledOpen: ErrStalledOpen, Outcome: breakerOutcome}

// breakerOutcome: cancellations, refusals of the breaker and budgets cut
// short by the caller are Neutral; outages are Stalled (timeouts) or
// Failed; any other error is a reply from a live server (Answered).
func breakerOutcome(err error) breaker.Outcome {
	var e *Error
	if !errors.As(err, &e) {
		e = classify(err, nil).(*Error)
	}
	neutral := e.Cause() == CauseCanceled || e.Cause() == CauseCircuitOpen || (e.Cause() == CauseTimeout && !e.Outage())
	return breaker.OutcomeOf(e.Outage(), e.Cause() == CauseTimeout, neutral)
}
