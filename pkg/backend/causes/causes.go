// Package causes holds what the network backends (Redis, memcached) share
// in telling why a call failed: the cause labels of
// ratelimitd_backend_errors_total{cause} and the failure-mode logs, and the
// classification of errors below their protocols (context, sockets,
// dialing). Each backend classifies its own protocol's replies first.
package causes

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// The cause labels both backends use; each backend documents when it
// reports them and adds its own (Redis: readonly, loading, ...).
const (
	// Timeout: the backend did not answer within the call's budget.
	Timeout = "timeout"
	// Refused: no usable connection (refused, reset, closed, unreachable).
	Refused = "refused"
	// OOM: the backend answered that it is out of memory.
	OOM = "oom"
	// Canceled: the caller canceled the request before the backend
	// answered (not a backend failure).
	Canceled = "canceled"
	// CircuitOpen: the circuit breaker is open after failures the backend
	// proved; the backend was not called.
	CircuitOpen = "circuit_open"
	// Other: anything else.
	Other = "other"
)

// Transport classifies err by the caller's context and the socket below
// the backend's protocol: Canceled (context.Canceled, not an outage);
// Timeout (context.DeadlineExceeded, os.ErrDeadlineExceeded, a net.Error
// whose Timeout is true); Refused (connection refused, reset or aborted,
// a broken pipe, an unreachable host or network, a unix socket that does
// not exist, EOF mid-reply, a closed connection). outage marks Timeout
// and Refused. ok is false when err is none of these.
func Transport(err error) (cause string, outage, ok bool) {
	switch {
	case errors.Is(err, context.Canceled):
		return Canceled, false, true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return Timeout, true, true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Timeout, true, true
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		noSocket(err):
		return Refused, true, true
	}
	return "", false, false
}

// noSocket reports a connect(2) that failed with ENOENT: a unix socket
// path with nothing at it (the server not started, or its socket
// removed), which is the unix form of a refused connection. Only the
// connect call counts: ENOENT from opening a file (a password file, a
// CA bundle) is a configuration error, not an outage.
func noSocket(err error) bool {
	var se *os.SyscallError
	return errors.As(err, &se) && se.Syscall == "connect" && errors.Is(se.Err, syscall.ENOENT)
}

// Dial reports whether err is a network operation or name resolution
// error (*net.OpError, *net.DNSError) that Transport did not classify: a
// connection that could not be made or used, which the backends count as
// Refused (an outage).
func Dial(err error) bool {
	var oe *net.OpError
	var de *net.DNSError
	return errors.As(err, &oe) || errors.As(err, &de)
}

// Classified is the classification a backend's Error type embeds
// (redis.Error, memcache.Error): a cause label, whether the error is an
// outage (it feeds the circuit breaker and the backend's health), and the
// error it classifies. Create one with New.
type Classified struct {
	backend string
	cause   string
	outage  bool
	err     error
}

// New returns the classification of err as cause, an outage or not, in
// the messages of backend ("redis", "memcache"). err must not be nil.
func New(backend, cause string, outage bool, err error) Classified {
	return Classified{backend: backend, cause: cause, outage: outage, err: err}
}

// Cause is the bounded label of the error (one of the backend's Causes).
func (c Classified) Cause() string { return c.cause }

// Outage reports whether the error suggests the backend is unreachable or
// not answering (what each backend's Error documents).
func (c Classified) Outage() bool { return c.outage }

// Error returns "<backend>: <cause>: <classified error>".
func (c Classified) Error() string { return c.backend + ": " + c.cause + ": " + c.err.Error() }

// Unwrap returns the classified error.
func (c Classified) Unwrap() error { return c.err }

// Wrap is each backend's Classify: nil for a nil err, err itself when its
// chain already holds an E (the backend's *Error), and otherwise
// wrap(cause, outage, err) of classify's cause and outage of err.
func Wrap[E error](err error, classify func(error) (cause string, outage bool), wrap func(cause string, outage bool, err error) E) error {
	if err == nil {
		return nil
	}
	var e E
	if errors.As(err, &e) {
		return err
	}
	cause, outage := classify(err)
	return wrap(cause, outage, err)
}

// Partial is a backend's error for a request decided in parts (Redis
// Cluster: one script call per hash slot) when some parts failed and
// another denied it. The request is denied whatever the failed parts would
// have said, so the decided hits are answered and only the failed ones are
// a failure.
type Partial struct {
	Decisions []algo.Decision // one per hit, in order; zero for a failed hit
	Failed    []int           // indexes into Decisions of the failed hits, ascending
	Err       error           // the failed parts' errors, joined
}

// Error returns Err's message.
func (p *Partial) Error() string { return p.Err.Error() }

// Unwrap returns Err, so that errors.As finds the failed parts' causes.
func (p *Partial) Unwrap() error { return p.Err }

// Decided returns Decisions and Failed (service.PartialFailure).
func (p *Partial) Decided() ([]algo.Decision, []int) { return p.Decisions, p.Failed }
