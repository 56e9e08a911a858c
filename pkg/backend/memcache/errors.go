package memcache

import (
	"errors"
	"strings"

	gomemcache "github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
)

// Causes are the bounded labels of the store's errors, used for
// ratelimitd_backend_errors_total{cause} and the failure-mode logs; those
// both network backends report are pkg/backend/causes' labels.
const (
	// CauseTimeout: memcached did not answer within the call's budget
	// (Options.Timeout, or the caller's deadline less a margin): a frozen
	// or overloaded server, a network black hole, a connect timeout.
	// Nothing proves a failure: the service sheds such a request like the
	// Redis backend's timeouts (failure_mode open requests get
	// DeadlineExceeded and the caller's own failure policy decides).
	CauseTimeout = causes.Timeout
	// CauseRefused: no usable connection (connection refused or reset,
	// closed mid-reply, unreachable host, no server configured or resolved
	// from the SRV record yet).
	CauseRefused = causes.Refused
	// CauseOOM: memcached answered "SERVER_ERROR out of memory" (it could
	// not store a new counter).
	CauseOOM = causes.OOM
	// CauseCanceled: the caller canceled the request before memcached
	// answered (not a backend failure).
	CauseCanceled = causes.Canceled
	// CauseCircuitOpen: the circuit breaker is open after failures
	// memcached proved (refused connections); memcached was not called
	// (ErrCircuitOpen).
	CauseCircuitOpen = causes.CircuitOpen
	// CauseUnsupported: a hit of an algorithm other than fixed_window
	// reached the store. Config loading refuses such rules (see
	// Store.Algorithms), so this means a wiring bug.
	CauseUnsupported = "unsupported"
	// CauseOther: anything else (an unexpected reply, a non-numeric value
	// under a counter key).
	CauseOther = causes.Other
)

// Causes lists every cause label.
var Causes = []string{CauseTimeout, CauseRefused, CauseOOM, CauseCanceled, CauseCircuitOpen, CauseUnsupported, CauseOther}

// Error is a classified store error. It implements service.Causer and
// unwraps to the gomemcache or network error it classifies. Its message
// never holds a key (keys may carry descriptor values in clear text with
// --key-values=clear).
type Error struct {
	cause string
	// outage marks errors that suggest memcached is unreachable or not
	// answering: they make Store.Healthy false until a call or probe
	// succeeds.
	outage bool
	err    error
}

// Cause is the bounded label of the error (one of Causes).
func (e *Error) Cause() string { return e.cause }

// Outage reports whether the error suggests memcached is unreachable
// (timeout, refused).
func (e *Error) Outage() bool { return e.outage }

// Error returns "memcache: <cause>: <underlying error>".
func (e *Error) Error() string { return "memcache: " + e.cause + ": " + e.err.Error() }

// Unwrap returns the classified error.
func (e *Error) Unwrap() error { return e.err }

// errTimeout is returned when a call's budget ran out before memcached
// answered.
var errTimeout = &Error{cause: CauseTimeout, outage: true, err: errors.New("no reply within the call's budget")}

// errBudgetCut is what the circuit breaker records for a call whose
// budget, cut short by the caller's deadline, ran out: less than a whole
// Timeout of silence proves nothing about memcached.
var errBudgetCut = &Error{cause: CauseTimeout, err: errors.New("no reply within the caller's deadline")}

// ErrCircuitOpen is returned, without calling memcached, while the circuit
// breaker is open after failures memcached proved (refused connections):
// the rules' failure modes decide. Its Cause is CauseCircuitOpen.
var ErrCircuitOpen = &Error{cause: CauseCircuitOpen, err: errors.New("circuit open, not calling memcached")}

// ErrStalledOpen is returned, without calling memcached, while the circuit
// is open because memcached stalled (only timeouts opened it): a frozen
// memcached and a very slow one look the same, so its cause is
// CauseTimeout, which the service sheds like a budget that ran out.
var ErrStalledOpen = &Error{cause: CauseTimeout, err: errors.New("circuit open after memcached stalled, not calling memcached")}

// errAbandoned stops a decision whose caller already returned (with
// errTimeout or its context's error): it says nothing about memcached.
var errAbandoned = &Error{cause: CauseTimeout, err: errors.New("caller gone: the decision stopped")}

// Classify wraps err in an *Error with its cause; nil stays nil and an err
// that already has an *Error in its chain is returned unchanged.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	cause, outage := classify(err)
	return &Error{cause: cause, outage: outage, err: err}
}

func classify(err error) (cause string, outage bool) {
	var cte *gomemcache.ConnectTimeoutError
	switch {
	case errors.As(err, &cte):
		return CauseTimeout, true
	case errors.Is(err, gomemcache.ErrNoServers):
		return CauseRefused, true
	}
	if c, outage, ok := causes.Transport(err); ok {
		return c, outage
	}
	if causes.Dial(err) {
		return CauseRefused, true
	}
	if strings.Contains(err.Error(), "SERVER_ERROR out of memory") {
		return CauseOOM, false
	}
	return CauseOther, false
}
