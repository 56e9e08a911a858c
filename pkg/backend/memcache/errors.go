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
// unwraps to the gomemcache or network error it classifies; its message
// is "memcache: <cause>: <underlying error>" and never holds a key (keys
// may carry descriptor values in clear text with --key-values=clear).
// Outage marks the errors that suggest memcached is unreachable or not
// answering (timeout, refused): they make Store.Healthy false until a
// call or probe succeeds.
type Error struct{ causes.Classified }

// newError returns the *Error of err classified as cause, an outage or
// not.
func newError(cause string, outage bool, err error) *Error {
	return &Error{causes.New("memcache", cause, outage, err)}
}

// errTimeout is returned when a call's budget ran out before memcached
// answered.
var errTimeout = newError(CauseTimeout, true, errors.New("no reply within the call's budget"))

// errBudgetCut is what the circuit breaker records for a call whose
// budget, cut short by the caller's deadline, ran out: less than a whole
// Timeout of silence proves nothing about memcached.
var errBudgetCut = newError(CauseTimeout, false, errors.New("no reply within the caller's deadline"))

// ErrCircuitOpen is returned, without calling memcached, while the circuit
// breaker is open after failures memcached proved (refused connections):
// the rules' failure modes decide. Its Cause is CauseCircuitOpen.
var ErrCircuitOpen = newError(CauseCircuitOpen, false, errors.New("circuit open, not calling memcached"))

// ErrStalledOpen is returned, without calling memcached, while the circuit
// is open because memcached stalled (only timeouts opened it): a frozen
// memcached and a very slow one look the same, so its cause is
// CauseTimeout, which the service sheds like a budget that ran out.
var ErrStalledOpen = newError(CauseTimeout, false, errors.New("circuit open after memcached stalled, not calling memcached"))

// errAbandoned stops a decision whose caller already returned (with
// errTimeout or its context's error): it says nothing about memcached.
var errAbandoned = newError(CauseTimeout, false, errors.New("caller gone: the decision stopped"))

// Classify wraps err in an *Error with its cause; nil stays nil and an err
// that already has an *Error in its chain is returned unchanged.
func Classify(err error) error {
	return causes.Wrap(err, classify, newError)
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
