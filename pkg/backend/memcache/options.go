package memcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/opterr"
)

// Defaults of Options (DefaultOptions).
const (
	// DefaultTimeout bounds each call to memcached: the socket read,
	// write and connect timeout of every operation, and the budget of a
	// Take whose caller's deadline is later (or absent).
	DefaultTimeout = 50 * time.Millisecond
	// DefaultMaxIdleConns is the number of idle connections kept per
	// memcached server. envoyproxy/ratelimit's MEMCACHE_MAX_IDLE_CONNS
	// defaults to 2; more keep concurrent decisions from dialing.
	DefaultMaxIdleConns = 16
	// DefaultHealthInterval is how often the health probe asks every
	// server for its version while the store is healthy; while it is not,
	// the probe asks every unhealthyProbeInterval.
	DefaultHealthInterval = time.Second
	// DeadlineMargin is kept before the caller's deadline: a Take returns
	// by deadline - min(DeadlineMargin, a quarter of the time left), so
	// that the service can still answer (the Redis backend's default
	// --redis-deadline-margin).
	DeadlineMargin = 2 * time.Millisecond
)

// unhealthyProbeInterval is the probe's interval while the store is not
// healthy: recovery is noticed within about this long.
const unhealthyProbeInterval = 100 * time.Millisecond

// LookupSRVFunc resolves an SRV record (net.Resolver.LookupSRV's shape).
type LookupSRVFunc func(ctx context.Context, service, proto, name string) (cname string, addrs []*net.SRV, err error)

// Options configure a Store. Start from DefaultOptions.
type Options struct {
	// Addrs are the memcached servers ("host:port", or a unix socket
	// path). Keys are spread over them by gomemcache's server selection
	// (CRC32 of the key modulo the number of servers, in the given order).
	// Exactly one of Addrs and SRV is set.
	Addrs []string
	// SRV is an SRV record name "_service._proto.name" (for example
	// "_memcache._tcp.cache.example.com") whose targets are the servers,
	// sorted by "host:port" so that every replica selects the same server
	// for a key (envoyproxy/ratelimit MEMCACHE_SRV).
	SRV string
	// SRVRefresh, when > 0, resolves SRV again at this interval and
	// replaces the server list when the lookup succeeds (a failed lookup
	// keeps the last list). 0 resolves once, retrying every
	// unhealthyProbeInterval until a lookup succeeds.
	SRVRefresh time.Duration
	// LookupSRV resolves SRV; nil uses net.DefaultResolver.LookupSRV.
	LookupSRV LookupSRVFunc
	// MaxIdleConns is the number of idle connections kept per server
	// (> 0).
	MaxIdleConns int
	// Timeout bounds every call (see DefaultTimeout); > 0.
	Timeout time.Duration
	// HealthInterval is the health probe's interval while healthy; 0
	// disables the probe (Healthy then follows the calls only).
	HealthInterval time.Duration
	// LocalCacheSize bounds the local over-limit cache (entries, >= 0; 0
	// disables it): see Store.Take and overlimit.Cache
	// (envoyproxy/ratelimit's LOCAL_CACHE_SIZE_IN_BYTES).
	LocalCacheSize int
	// Now, when set, is the clock that places hits in windows (tests);
	// nil uses time.Now.
	Now func() time.Time
	// OnCircuit, when not nil, is the circuit breaker's OnTransition
	// (breaker.Options.OnTransition): called after each state change of
	// the breaker of a one-server Store, with the new state, on the
	// goroutine of the call that changed it; keep it fast (a log line, a
	// counter). nil: transitions show on BreakerState only.
	OnCircuit func(to breaker.State)
	// OnCircuitReport, when not nil, is the circuit breaker's OnReport
	// (breaker.Options.OnReport): the reports of an outage for its log
	// lines, rate-limited.
	OnCircuitReport func(breaker.Report)
	// Clock is what the circuit breaker reads and the health probe waits
	// on; nil is clock.System. Tests set a clock.Manual to drive them.
	Clock bclock.Clock
}

// DefaultOptions are the defaults of every field; Addrs or SRV must be
// set.
func DefaultOptions() Options {
	return Options{
		MaxIdleConns:   DefaultMaxIdleConns,
		Timeout:        DefaultTimeout,
		HealthInterval: DefaultHealthInterval,
	}
}

var srvName = regexp.MustCompile(`^_([^.]+)\._([^.]+)\.(.+)$`)

// parseSRV splits "_service._proto.name" into its parts.
func parseSRV(s string) (service, proto, name string, err error) {
	m := srvName.FindStringSubmatch(s)
	if m == nil {
		return "", "", "", fmt.Errorf("memcache: SRV name %q: want _service._proto.name (e.g. _memcache._tcp.example.com)", s)
	}
	return m[1], m[2], m[3], nil
}

// Errors of Validate about the server list (neither or both sources).
var (
	ErrNoServer         = errors.New("memcache: no server: set the addresses or an SRV record")
	ErrTwoServerSources = errors.New("memcache: both addresses and an SRV record are set; use one")
)

// Validate reports every problem of o, joined: ErrNoServer or
// ErrTwoServerSources; an address that is neither host:port nor a unix
// socket path; a malformed SRV name; and, as *opterr.FieldError, a
// negative SRVRefresh, LocalCacheSize or HealthInterval, or MaxIdleConns
// or Timeout not > 0.
func (o Options) Validate() error {
	var errs []error
	bad := func(field, label string, v any, reason string) {
		errs = append(errs, &opterr.FieldError{Package: "memcache", Field: field, Label: label, Value: v, Reason: reason})
	}
	switch {
	case len(o.Addrs) == 0 && o.SRV == "":
		errs = append(errs, ErrNoServer)
	case len(o.Addrs) > 0 && o.SRV != "":
		errs = append(errs, ErrTwoServerSources)
	}
	for _, a := range o.Addrs {
		if strings.Contains(a, "/") {
			continue // a unix socket path
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("memcache: server %q: want host:port or a unix socket path: %w", a, err))
		}
	}
	if o.SRV != "" {
		if _, _, _, err := parseSRV(o.SRV); err != nil {
			errs = append(errs, err)
		}
	}
	if o.SRVRefresh < 0 {
		bad("SRVRefresh", "SRV refresh", o.SRVRefresh, "must be >= 0 (0: resolve once)")
	}
	if o.MaxIdleConns <= 0 {
		bad("MaxIdleConns", "max idle connections", o.MaxIdleConns, "must be > 0")
	}
	if o.Timeout <= 0 {
		bad("Timeout", "timeout", o.Timeout, "must be > 0")
	}
	if o.LocalCacheSize < 0 {
		bad("LocalCacheSize", "local cache size", o.LocalCacheSize, "must be >= 0")
	}
	if o.HealthInterval < 0 {
		bad("HealthInterval", "health interval", o.HealthInterval, "must be >= 0")
	}
	return errors.Join(errs...)
}
