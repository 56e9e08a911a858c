package postgres

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

// Defaults of DefaultOptions.
const (
	// DefaultTimeout bounds a decision whose caller has no earlier
	// deadline: one call of ratelimitd_take on loopback takes about a
	// millisecond, a busy server a few.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultDeadlineMargin is kept before a caller's deadline, as the
	// Redis store keeps it: a call is decided by deadline − min(margin, a
	// quarter of the time left), so that the service can still answer.
	DefaultDeadlineMargin = 2 * time.Millisecond
	// DefaultMaxConns is the pool's size: concurrent decisions beyond it
	// wait for a connection (within their budget).
	DefaultMaxConns = 16
	// DefaultHealthInterval is the health probe's period while healthy;
	// while not, it probes every unhealthyProbeInterval.
	DefaultHealthInterval = time.Second
	// DefaultSweepInterval is how often expired rows are deleted.
	DefaultSweepInterval = time.Minute
	// DefaultConnectTimeout bounds each background attempt to reach
	// PostgreSQL and check or migrate the schema (see New).
	DefaultConnectTimeout = 5 * time.Second
	// DefaultSweepBatch is how many rows one DELETE of the sweeper removes
	// at most (each its own short transaction).
	DefaultSweepBatch = 1000
)

// unhealthyProbeInterval is the probe's period while the store is not
// healthy: recovery is noticed within about this long.
const unhealthyProbeInterval = 100 * time.Millisecond

// After a login the server refused (CauseAuth) or a failed TLS handshake
// (CauseTLS), which only an operator fixes, the connect loop and the
// probe wait loginBackoffMin, doubling up to loginBackoffMax, between
// attempts: retrying a wrong password every unhealthyProbeInterval would
// fill the server's log and trip lockouts such as fail2ban.
const (
	loginBackoffMin = time.Second
	loginBackoffMax = 30 * time.Second
)

// retryAfter is the wait before the next attempt after err, given the
// previous wait prev: unhealthyProbeInterval, or after an auth or TLS
// error twice prev, within [loginBackoffMin, loginBackoffMax].
func retryAfter(err error, prev time.Duration) time.Duration {
	if c := causeLabel(err); c != CauseAuth && c != CauseTLS {
		return unhealthyProbeInterval
	}
	return min(max(2*prev, loginBackoffMin), loginBackoffMax)
}

// BreakerOptions configure the Store's circuit breaker (breaker.Options),
// named as the Redis store names them.
type BreakerOptions = breaker.Options

// BreakerState is a circuit breaker's state (breaker.State).
type BreakerState = breaker.State

// BreakerReport is one report of an outage for the log (breaker.Report).
type BreakerReport = breaker.Report

// DefaultBreakerOptions are breaker.DefaultOptions.
func DefaultBreakerOptions() BreakerOptions { return breaker.DefaultOptions() }

// Options configure a Store. Start from DefaultOptions; URL is required.
type Options struct {
	// URL is a postgres:// (or postgresql://) URL, with libpq's query
	// parameters (sslmode, ...). Its password is never printed: errors
	// and logs show RedactURL's form.
	URL string
	// Password, when set, replaces the URL's password (read from
	// --durable-password-file).
	Password string
	// Timeout bounds a decision when the caller's deadline (less the
	// margin) is later or absent, and every statement of the probe and
	// the sweeper; > 0.
	Timeout time.Duration
	// DeadlineMargin is kept before the caller's deadline (see
	// DefaultDeadlineMargin); >= 0.
	DeadlineMargin time.Duration
	// MaxConns is the pool's size (> 0).
	MaxConns int32
	// Logger receives the sweeper's and the schema's log lines; nil
	// discards them.
	Logger *slog.Logger
	// Breaker configures the circuit breaker guarding every decision
	// (pkg/backend/breaker). Default DefaultBreakerOptions.
	Breaker BreakerOptions
	// HealthInterval is the health probe's period while healthy (see
	// Store.Healthy); 0 disables the probe.
	HealthInterval time.Duration
	// SweepInterval is how often the sweeper deletes expired rows; 0
	// disables it.
	SweepInterval time.Duration
	// SweepBatch bounds the rows one DELETE of the sweeper removes (> 0).
	SweepBatch int
	// ConnectTimeout bounds each background attempt to reach PostgreSQL
	// and check or migrate the schema after New could not (which waits
	// for another replica's migration too); > 0.
	ConnectTimeout time.Duration
	// AsyncCommit sets synchronous_commit=off for the store's sessions:
	// a decision does not wait for its WAL to reach the disk, and a
	// crash of PostgreSQL loses the counts of the last moments (up to
	// three times wal_writer_delay), whose requests were admitted. false
	// (the default) waits: a count a decision returned is never lost.
	AsyncCommit bool
	// Clock is what the circuit breaker reads and the health probe, the
	// connect loop and the sweeper wait on; nil is clock.System. Tests
	// set a clock.Manual to drive them.
	Clock bclock.Clock
}

// DefaultOptions are the defaults of every field but URL.
func DefaultOptions() Options {
	return Options{
		Timeout:        DefaultTimeout,
		DeadlineMargin: DefaultDeadlineMargin,
		MaxConns:       DefaultMaxConns,
		Breaker:        DefaultBreakerOptions(),
		HealthInterval: DefaultHealthInterval,
		SweepInterval:  DefaultSweepInterval,
		SweepBatch:     DefaultSweepBatch,
		ConnectTimeout: DefaultConnectTimeout,
	}
}

// ErrNoURL is Validate's error for an empty URL.
var ErrNoURL = errors.New("postgres: no URL: set a postgres:// URL")

// Validate reports every invalid field, joined. Its messages never hold
// the password.
func (o Options) Validate() error {
	var errs []error
	if o.URL == "" {
		errs = append(errs, ErrNoURL)
	} else if u, err := url.Parse(o.URL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		errs = append(errs, fmt.Errorf("postgres: URL %s: %s", RedactURL(o.URL), urlHint))
	}
	if o.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("postgres: timeout %v: must be > 0", o.Timeout))
	}
	if o.DeadlineMargin < 0 {
		errs = append(errs, fmt.Errorf("postgres: deadline margin %v: must be >= 0", o.DeadlineMargin))
	}
	if o.MaxConns <= 0 {
		errs = append(errs, fmt.Errorf("postgres: max connections %d: must be > 0", o.MaxConns))
	}
	if o.HealthInterval < 0 {
		errs = append(errs, fmt.Errorf("postgres: health interval %v: must be >= 0", o.HealthInterval))
	}
	if o.SweepInterval < 0 {
		errs = append(errs, fmt.Errorf("postgres: sweep interval %v: must be >= 0", o.SweepInterval))
	}
	if o.ConnectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("postgres: connect timeout %v: must be > 0", o.ConnectTimeout))
	}
	if o.SweepBatch <= 0 {
		errs = append(errs, fmt.Errorf("postgres: sweep batch %d: must be > 0", o.SweepBatch))
	}
	if err := o.Breaker.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("postgres: %w", err))
	}
	return errors.Join(errs...)
}

const redacted = "xxxxx"

// urlHint is Validate's advice on a URL it refuses, which it does not
// show: the common causes are a libpq key/value string and a password
// with characters a URL reserves.
const urlHint = "want postgres://user@host:port/database (not a key/value string); " +
	"percent-encode reserved characters of the password (# / ? @ : % and space), or give the password apart (--durable-password-file)"

// RedactURL returns raw with its password and its query values replaced
// by "xxxxx", without its fragment, for logs and errors; a value that is
// not a postgres:// URL (it does not parse, or it is a libpq key/value
// string) is replaced whole.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// Not a postgres:// URL (a libpq key/value string, a typo): where
		// its password is cannot be told.
		return redacted
	}
	u.Fragment, u.RawFragment = "", ""
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			if k != "sslmode" && k != "application_name" && k != "connect_timeout" {
				q.Set(k, redacted)
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// secrets are the strings no message may show: the password given and
// the URL's own, and their URL-escaped forms.
func (o Options) secrets() []string {
	var out []string
	add := func(s string) {
		if s != "" {
			out = append(out, s, url.QueryEscape(s), url.PathEscape(s))
		}
	}
	add(o.Password)
	for _, pw := range URLPasswords(o.URL) {
		add(pw)
	}
	return out
}

// URLPasswords returns the passwords raw holds: as a postgres:// URL, its
// user info's and its query's password and sslpassword; as a libpq
// key/value string (which the store refuses, but a message may still
// quote), their values.
func URLPasswords(raw string) []string {
	var out []string
	if u, err := url.Parse(raw); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw)
		}
		for k, vs := range u.Query() {
			if strings.Contains(strings.ToLower(k), "password") {
				out = append(out, vs...)
			}
		}
		return out
	}
	for _, m := range kvPassword.FindAllStringSubmatch(raw, -1) {
		v := m[1]
		if strings.HasPrefix(v, "'") {
			v = strings.NewReplacer(`\'`, "'", `\\`, `\`).Replace(strings.TrimSuffix(v[1:], "'"))
		}
		out = append(out, v)
	}
	return out
}

// kvPassword matches a password or sslpassword of a libpq key/value
// string: a value in single quotes (backslash escapes) or up to the next
// space.
var kvPassword = regexp.MustCompile(`(?i)password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)`)

// scrub replaces every secret in s by "xxxxx".
func scrub(s string, secrets []string) string {
	for _, x := range secrets {
		if len(x) >= 1 {
			s = strings.ReplaceAll(s, x, redacted)
		}
	}
	return s
}
