package redis

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
)

// Causes are the bounded labels of backend errors, used for
// ratelimitd_backend_errors_total{cause} and failure-mode logs; those both
// network backends report are pkg/backend/causes' labels.
const (
	// CauseTimeout: the call's budget ran out while a socket to Redis was
	// stalled (a request written Options.Timeout ago or more with no byte
	// of reply: frozen or overloaded Redis, network black hole), a network
	// or pool timeout, before the stall is established (CauseStalled).
	// Nothing proves a failure yet: the service sheds it.
	CauseTimeout = causes.Timeout
	// CauseStalled: the stall is established (a request unanswered and
	// nothing received from the master for the breaker's FailFor; see
	// batcher) and the master is still silent, or the circuit is open after
	// that stall (ErrStalled, ErrStalledOpen). An outage, as for a dead
	// Redis: the rules' failure modes answer.
	CauseStalled = "stalled"
	// CauseRefused: no usable connection (connection refused, unreachable
	// host, a unix socket path with no socket at it, TLS handshake
	// failure, the client closed).
	CauseRefused = causes.Refused
	// CauseReset: an established connection was lost mid-call (EOF,
	// reset, broken pipe): the call's outcome is unknown. Redis may still
	// be up (its `timeout`, client-output-buffer-limit, CLIENT KILL, a
	// proxy), so the calls in flight on the lost connections count as one
	// failure for the circuit breaker (breaker.Dropped).
	CauseReset = "reset"
	// CauseOOM: Redis answered "OOM command not allowed when used memory >
	// 'maxmemory'" (maxmemory with a noeviction policy).
	CauseOOM = causes.OOM
	// CauseReadonly: Redis answered READONLY (a replica, e.g. a former
	// master right after a Sentinel failover) or NOREPLICAS (a master
	// configured with min-replicas-to-write that has too few replicas in
	// sync: it refuses writes rather than risk losing them in a failover).
	CauseReadonly = "readonly"
	// CauseLoading: Redis answered LOADING (loading its dataset at startup)
	// or MASTERDOWN (a replica that lost its master).
	CauseLoading = "loading"
	// CauseClusterDown: Redis Cluster answered CLUSTERDOWN or TRYAGAIN
	// (slots not served, resharding), or MOVED/ASK beyond the redirect limit.
	CauseClusterDown = "clusterdown"
	// CauseNoScript: Redis answered NOSCRIPT (script cache flushed); the
	// Store reloads the script and retries, so this rarely escapes.
	CauseNoScript = "noscript"
	// CauseAuth: the server refused the Store's configuration:
	// authentication or ACL permission failure (WRONGPASS, NOAUTH, NOPERM),
	// a database index it does not have (the URL's /N beyond its
	// `databases`), or an untrusted server certificate, and
	// ErrLoginBackoff after such a refusal (see loginGate). A
	// configuration error, not an outage: it does not open the circuit,
	// but Store.Healthy is false until a call succeeds.
	CauseAuth = "auth"
	// CauseCircuitOpen: the circuit breaker is open; Redis was not called.
	CauseCircuitOpen = causes.CircuitOpen
	// CauseDeadline: the call was not decided within its budget (the
	// caller's deadline less a margin, or Options.MaxWait) while Redis was
	// answering: ratelimitd itself was too slow (a burst, CPU starvation).
	// Not an outage: it never opens the circuit (see ErrDeadline).
	CauseDeadline = "deadline"
	// CauseCanceled: the caller canceled the request's context before
	// Redis answered (not a backend failure).
	CauseCanceled = causes.Canceled
	// CauseOther: anything else (script error replies, unexpected replies).
	CauseOther = causes.Other
)

// Causes lists every cause label, for pre-initialising metric series.
var Causes = []string{
	CauseTimeout, CauseStalled, CauseRefused, CauseReset, CauseOOM, CauseReadonly, CauseLoading,
	CauseClusterDown, CauseNoScript, CauseAuth, CauseCircuitOpen,
	CauseDeadline, CauseCanceled, CauseOther,
}

// Error is a classified backend error. It implements service.Causer
// (Cause returns one of the Cause* labels) and unwraps to the go-redis or
// network error it classifies; its message is "redis: <cause>:
// <underlying error>". Outage marks the errors that suggest Redis is
// unreachable or not serving, which feed the circuit breaker: timeout,
// refused, loading, clusterdown, and connection-level "other" errors;
// error replies from a live server (OOM, READONLY, auth, script errors)
// are not outages.
type Error struct{ causes.Classified }

// newError returns the *Error of err classified as cause, an outage or
// not.
func newError(cause string, outage bool, err error) *Error {
	return &Error{causes.New("redis", cause, outage, err)}
}

// ErrCircuitOpen is returned, without calling Redis, while the circuit
// breaker is open. Its Cause is CauseCircuitOpen.
var ErrCircuitOpen = newError(CauseCircuitOpen, false, errors.New("circuit open, not calling redis"))

// ErrStalledOpen is returned, without calling Redis, while the circuit is
// open because Redis stalled (only stalls opened it, once they had lasted
// the breaker's FailFor): the stall is established, so its cause is
// CauseStalled and the rules' failure modes answer, as for a dead Redis;
// ErrCircuitOpen is for a circuit opened by failures Redis proved
// (refused connections, LOADING, CLUSTERDOWN).
var ErrStalledOpen = newError(CauseStalled, false, errors.New("circuit open after Redis stalled, not calling redis"))

// Classify wraps err in an *Error with its cause; nil stays nil and an err
// that already has an *Error in its chain is returned unchanged.
func Classify(err error) error {
	return causes.Wrap(err, classify, newError)
}

// CauseOf returns the cause label of err: its Cause() when err (or an error
// it wraps) implements it, otherwise the classification of err; "" for nil.
func CauseOf(err error) string {
	if err == nil {
		return ""
	}
	var c interface{ Cause() string }
	if errors.As(err, &c) {
		return c.Cause()
	}
	cause, _ := classify(err)
	return cause
}

func classify(err error) (cause string, outage bool) {
	// Error replies first: a live server answered.
	var re goredis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		switch {
		case strings.HasPrefix(msg, "OOM "):
			return CauseOOM, false
		case strings.HasPrefix(msg, "READONLY "), strings.HasPrefix(msg, "NOREPLICAS "):
			return CauseReadonly, false
		case strings.HasPrefix(msg, "LOADING "), strings.HasPrefix(msg, "MASTERDOWN "):
			return CauseLoading, true
		case strings.HasPrefix(msg, "CLUSTERDOWN "), strings.HasPrefix(msg, "TRYAGAIN "),
			strings.HasPrefix(msg, "MOVED "), strings.HasPrefix(msg, "ASK "):
			return CauseClusterDown, true
		case strings.HasPrefix(msg, "NOSCRIPT "):
			return CauseNoScript, false
		case strings.HasPrefix(msg, "WRONGPASS "), strings.HasPrefix(msg, "NOAUTH "),
			strings.HasPrefix(msg, "NOPERM "), strings.HasPrefix(msg, "ERR DB index is out of range"):
			return CauseAuth, false
		}
		// go-redis also reports some client-side conditions as Error
		// values (pool timeout, closed client); fall through for those.
		if !errors.Is(err, goredis.ErrPoolTimeout) && !errors.Is(err, goredis.ErrClosed) {
			return CauseOther, false
		}
	}
	if errors.Is(err, ErrLoginBackoff) {
		return CauseAuth, false
	}
	if c, outage, ok := causes.Transport(err); ok {
		if c == causes.Refused && lostConn(err) {
			return CauseReset, true
		}
		return c, outage
	}
	switch {
	case errors.Is(err, goredis.ErrPoolTimeout):
		return CauseTimeout, true
	case errors.Is(err, goredis.ErrClosed):
		return CauseRefused, true
	}
	var cve *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	var he x509.HostnameError
	if errors.As(err, &cve) || errors.As(err, &ua) || errors.As(err, &ci) || errors.As(err, &he) {
		return CauseAuth, false
	}
	var rhe tls.RecordHeaderError
	if errors.As(err, &rhe) || causes.Dial(err) {
		return CauseRefused, true
	}
	return CauseOther, true
}

// lostConn reports whether err, a refused connection (causes.Transport),
// is the loss of an established connection: EOF, a reset or a broken pipe
// on a read or write, not a dial that failed.
func lostConn(err error) bool {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.EPIPE)
}

// stampUnsent gives the commands of a pipeline that failed before any was
// sent the pipeline's error err. go-redis sets a pipeline's error on its
// commands only when it is not a Redis reply: when getting a connection
// failed with one (WRONGPASS or NOAUTH while setting up a new
// connection), every command kept a nil error and a nil value, which read
// as an unexpected reply instead of the refusal.
func stampUnsent(cmds []goredis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, c := range cmds {
		if c.Err() != nil { // sent: each command has its own outcome
			return
		}
	}
	for _, c := range cmds {
		c.SetErr(err)
	}
}
