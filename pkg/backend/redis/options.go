// Package redis is the Redis store of ratelimitd: one Lua script decides all
// hits of a request atomically with the server's TIME, on standalone,
// Sentinel or Cluster deployments.
package redis

import (
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/opterr"
)

// Mode is the Redis deployment topology.
type Mode string

const (
	// Standalone dials the one server of Options.URL (the default).
	Standalone Mode = "standalone"
	Cluster    Mode = "cluster"  // Addrs are seed nodes
	Sentinel   Mode = "sentinel" // Addrs are sentinels, MasterName the monitored master
)

// Defaults of DefaultOptions.
const (
	// DefaultURL is the --redis-url default (README's flag table).
	DefaultURL = "redis://127.0.0.1:6379/0"
	// DefaultTimeout is how long Redis may leave an invocation unanswered
	// (with no other reply meanwhile) before the Store takes it as
	// evidence of a failed Redis (see Options.Timeout). A healthy Redis
	// answers an EVALSHA in well under 1 ms.
	DefaultTimeout = 10 * time.Millisecond
	// DefaultMaxWait is the budget of a call whose caller set no deadline
	// (Options.MaxWait). Envoy always sets one (its filter timeout, 20 ms
	// by default); HTTP /json callers and tests may not.
	DefaultMaxWait = time.Second
	// DefaultDeadlineMargin is kept before a caller's deadline
	// (Options.DeadlineMargin): with Envoy's 20 ms, a call has 18 ms to be
	// decided, and its answer leaves in time for Envoy to read it.
	DefaultDeadlineMargin = 2 * time.Millisecond
	// DefaultProbeKey is Options.ProbeKey when empty.
	DefaultProbeKey = "ratelimitd-health-probe"
	// DefaultDialTimeout bounds the health probe's warm-ups (Options.
	// DialTimeout). A request waits for its own dial within its budget;
	// the dial itself is bounded by MaxWait (see NewClient).
	DefaultDialTimeout = 250 * time.Millisecond
	// DefaultPoolSize is the connections per Redis node. Concurrent requests
	// share them (go-redis pipelines nothing by itself; the Store batches).
	DefaultPoolSize = 16
	// DefaultMinIdleConns keeps connections dialed ahead of traffic so that
	// requests do not pay for dials (TLS handshakes in particular).
	DefaultMinIdleConns = 2
)

// Options configure the Redis client and Store. The zero value is not
// valid; start from DefaultOptions and call Validate.
type Options struct {
	// URL is redis:// or rediss:// (TLS) with optional user:password@ and
	// /db, e.g. "rediss://alice:pw@redis:6380/2". Standalone mode dials its
	// host; cluster and sentinel modes take only credentials, TLS and DB from
	// it (its host is ignored; an empty URL means no auth, no TLS, DB 0).
	URL string
	// Mode is the topology (REDIS_TYPE); the zero value "" is invalid
	// (DefaultOptions sets Standalone). See ParseMode.
	Mode Mode
	// Addrs are "host:port" seed nodes (Cluster) or sentinels (Sentinel);
	// empty in Standalone mode.
	Addrs []string
	// MasterName is the master's name monitored by the sentinels (Sentinel
	// mode only; required there).
	MasterName string
	// Username and Password, when non-empty, override the URL's credentials
	// (envoyproxy/ratelimit's REDIS_AUTH "password" or "user:password").
	Username string
	// Password is the AUTH password (with Username for an ACL user);
	// empty keeps the URL's. PasswordFile wins over it.
	Password string
	// PasswordFile, when non-empty, names a file holding the password (a
	// mounted Kubernetes Secret key; one trailing newline is ignored). It
	// is read again for every new connection, so a rotated secret takes
	// effect on the next dial without a restart (after a refused login,
	// within the dial backoff: at most 30 s), and it wins over Password
	// and the URL's password. A file that is missing or empty fails the
	// dial (and New, which reads it once).
	PasswordFile string
	// SentinelUsername and SentinelPassword authenticate to the sentinels
	// themselves (REDIS_SENTINEL_AUTH); empty means none.
	SentinelUsername string
	// SentinelPassword is the sentinels' AUTH password; empty means the
	// sentinels require none.
	SentinelPassword string

	// TLS forces TLS even with a redis:// URL (REDIS_TLS); rediss:// implies
	// it. TLSCAFile is a PEM bundle of trusted CAs (empty: system roots);
	// TLSCertFile and TLSKeyFile are a PEM client certificate and key for
	// mutual TLS (both or neither). TLSSkipHostname skips only the check
	// of the server's name (REDIS_TLS_SKIP_HOSTNAME_VERIFICATION);
	// TLSSkipVerify disables server certificate verification.
	TLS bool
	// TLSCAFile is a PEM bundle of the CAs trusted for the server's
	// certificate (REDIS_TLS_CACERT); empty means the system roots. Needs
	// TLS on.
	TLSCAFile string
	// TLSCertFile is the PEM client certificate for mutual TLS
	// (REDIS_TLS_CLIENT_CERT); set with TLSKeyFile or not at all.
	TLSCertFile string
	// TLSKeyFile is TLSCertFile's PEM private key (REDIS_TLS_CLIENT_KEY).
	TLSKeyFile string
	// TLSSkipHostname accepts a server certificate that does not name the
	// host dialed, as long as it chains to TLSCAFile (or the system roots)
	// and is valid for server authentication: what envoyproxy/ratelimit's
	// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION does. Needs TLS on.
	TLSSkipHostname bool
	// TLSSkipVerify accepts any server certificate (tls.Config
	// InsecureSkipVerify): neither its chain nor its name is checked.
	// Needs TLS on; false (verify) is the zero value.
	TLSSkipVerify bool

	// Timeout is how long Redis may leave a sent invocation unanswered,
	// with no reply to anything else meanwhile, before the Store counts it
	// as a backend failure: the circuit breaker gets one failure per
	// Timeout of silence, and a call whose budget then runs out gets its
	// rules' failure modes (cause "timeout"). Time a call spends queued
	// inside ratelimitd never counts against it. It also bounds the health
	// probe's PING. Default DefaultTimeout; > 0.
	Timeout time.Duration
	// MaxWait is the budget of a call whose context has no deadline: it is
	// decided within MaxWait or completes with ErrDeadline (cause
	// "deadline"). It also bounds a call with a later deadline. Default
	// DefaultMaxWait; > 0.
	MaxWait time.Duration
	// DeadlineMargin is kept before the caller's context deadline: a call
	// is decided by deadline − min(DeadlineMargin, a quarter of the time
	// left) or completes with ErrDeadline, so that ratelimitd's answer
	// reaches the caller before it gives up. Default
	// DefaultDeadlineMargin; >= 0.
	DeadlineMargin time.Duration
	// DialTimeout bounds the health probe's warm-ups after an outage
	// (dials, TLS handshakes, SCRIPT LOAD). Default DefaultDialTimeout.
	DialTimeout time.Duration
	// PoolSize is the maximum connections per Redis node (>= 1). Default
	// DefaultPoolSize.
	PoolSize int
	// MinIdleConns connections per node are kept dialed (0..PoolSize).
	// Default DefaultMinIdleConns.
	MinIdleConns int
	// Pipelines is how many pipelines of batched requests may be in flight
	// at once (each on its own pooled connection; capped at PoolSize), per
	// master: on Cluster each master has its own batcher with this many. A
	// request that finds them all busy joins the next batch. 0 means
	// DefaultPipelines.
	Pipelines int

	// KeyPrefix is prepended by the policy package already; nothing is added
	// here.

	// LocalCacheSize bounds the local over-limit cache (entries); 0 disables it.
	LocalCacheSize int

	// WindowKeys counts fixed_window limits (without a calendar) under
	// one key per window, "<key>:v2:<window_start_us>" (the key wrapped
	// in {…} when it has no hash tag), holding a plain count: decided by
	// INCRBY with no read before the write and, outside one call per
	// second per master, no read of the server's clock (window.lua). On
	// in DefaultOptions. It also keeps sliding_window limits (without a
	// calendar) in one key per window, "<key>:v2s:<window_start_us>",
	// and token_bucket limits in "<key>:v2g" holding the TAT as an
	// integer (lean.lua). Off: the value "<window_start_us> <count>" under
	// the key itself (take.lua), the layout of releases before window
	// keys. The two layouts do not see each other's counts: see
	// docs/redis.md, "Window keys", for switching.
	WindowKeys bool

	// Breaker configures the circuit breaker guarding every call. Default
	// DefaultBreakerOptions.
	Breaker BreakerOptions

	// HealthInterval is the period of the Store's health probe (see
	// Healthy): every HealthInterval, when no call succeeded within the
	// last HealthInterval or the circuit is not closed, one PING (Cluster:
	// one per master, in turn) goes through the breaker. 0 disables the
	// probe (Healthy then changes only with traffic); >= 0. Default
	// DefaultHealthInterval (1 s).
	HealthInterval time.Duration

	// ProbeKey is the key the health probe writes (one fixed-window hit,
	// expiring within a second) to learn whether a server that refused
	// writes (OOM, READONLY) counts again. ratelimitd sets it under its
	// --key-prefix so that an ACL limited to the prefix allows it. Default
	// DefaultProbeKey.
	ProbeKey string
	// CacheUncharged lets the local over-limit cache answer always_charge
	// hits on fixed windows without charging them, as envoyproxy/ratelimit
	// does (ratelimitd sets it in reference mode). Without it such hits
	// always reach Redis and are charged (overlimit.Cache.WithoutUncharged).
	CacheUncharged bool
	// CreditChannel is the pub/sub channel on which every refund and
	// reset publishes the keys it credited, and to which a Store with a
	// local over-limit cache subscribes to drop them (see
	// Store.CreditsLive). Replicas that share counters must share it; an
	// ACL user needs SUBSCRIBE and PUBLISH on it. Default
	// DefaultCreditChannel.
	CreditChannel string

	// WaitReplicas, when > 0 (standalone or Sentinel with replicas), makes
	// every script invocation wait for that many replicas to acknowledge
	// its writes (WAIT WaitReplicas Timeout, in the same pipeline): a
	// decision is used only once it would survive a failover; otherwise
	// the rules' failure modes answer (ErrNotReplicated). It costs a
	// replica round trip per batch. 0 (the default) waits for nothing;
	// not supported in Cluster mode.
	WaitReplicas int

	// NativeCounting decides fixed-window hits under always_charge
	// (algo.Hit.Charge) with pipelined INCRBY and PEXPIRE instead of the
	// script, as envoyproxy/ratelimit counts (ratelimitd sets it in
	// reference mode). Their counters are then other keys than the
	// script's (the hit's key followed by ":" and the window start), so
	// every hit on a key must have the same Charge, as the service's hits
	// of one rule do; turning it on or off restarts those counters. The
	// window comes from the service's clock, not the server's TIME. See
	// docs/redis.md, "Native counting".
	NativeCounting bool

	// Now, when set (tests only), pins the script's clock instead of the
	// server's TIME. The breakers read Clock.
	Now func() time.Time

	// Clock is what the circuit breakers, the health probe and the
	// batchers read and wait on; nil is clock.System. Tests set a
	// clock.Manual to drive them.
	Clock bclock.Clock
}

// DefaultOptions returns standalone options for DefaultURL with the default
// timeouts, pool and breaker; the local over-limit cache is disabled.
func DefaultOptions() Options {
	return Options{
		URL:          DefaultURL,
		Mode:         Standalone,
		Timeout:      DefaultTimeout,
		MaxWait:      DefaultMaxWait,
		DialTimeout:  DefaultDialTimeout,
		PoolSize:     DefaultPoolSize,
		MinIdleConns: DefaultMinIdleConns,
		Breaker:      DefaultBreakerOptions(),

		DeadlineMargin: DefaultDeadlineMargin,
		HealthInterval: DefaultHealthInterval,
		ProbeKey:       DefaultProbeKey,
		CreditChannel:  DefaultCreditChannel,
		WindowKeys:     true,
	}
}

// ParseMode parses "standalone", "cluster" or "sentinel" (case-insensitive;
// envoyproxy/ratelimit's REDIS_TYPE "single" means standalone).
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "standalone", "single", "":
		return Standalone, nil
	case "cluster":
		return Cluster, nil
	case "sentinel":
		return Sentinel, nil
	}
	return "", fmt.Errorf("redis: unknown mode %q (want standalone, cluster or sentinel)", s)
}

// Validate reports every problem of o, joined, each a *opterr.FieldError:
// unknown mode, unparsable URL, addrs missing or misplaced for the mode,
// missing master name, a DB other than 0 in cluster mode, TLS settings
// with TLS off, half a client key pair, non-positive timeouts or pool
// size, min idle conns outside 0..PoolSize, negative wait replicas (or
// any in cluster mode), pipelines, health interval or local cache size,
// and each breaker field BreakerOptions.Validate refuses (unless the
// breaker is disabled).
func (o Options) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &opterr.FieldError{Package: "redis", Sentence: true, Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	var url *goredis.Options
	if o.URL != "" {
		if err := CheckURL(o.URL, o.Mode == Standalone); err != nil {
			bad("URL", "%s", urlError(err))
		} else {
			url, _ = goredis.ParseURL(o.URL)
		}
	}
	switch o.Mode {
	case Standalone:
		if o.URL == "" {
			bad("URL", "standalone mode needs a url")
		}
		if len(o.Addrs) > 0 {
			bad("Addrs", "addrs are for cluster and sentinel modes; standalone dials the url's host")
		}
	case Cluster:
		if len(o.Addrs) == 0 {
			bad("Addrs", "cluster mode needs at least one seed node in addrs")
		}
		if url != nil && url.DB != 0 {
			bad("URL", "cluster mode supports only db 0, url selects db %d", url.DB)
		}
	case Sentinel:
		if len(o.Addrs) == 0 {
			bad("Addrs", "sentinel mode needs at least one sentinel in addrs")
		}
		if o.MasterName == "" {
			bad("MasterName", "sentinel mode needs a master name")
		}
	default:
		bad("Mode", "unknown mode %q (want standalone, cluster or sentinel)", o.Mode)
	}
	for _, a := range o.Addrs {
		if !strings.Contains(a, ":") {
			bad("Addrs", "addr %q is not host:port", a)
		}
	}
	tlsOn := o.TLS || (url != nil && url.TLSConfig != nil)
	if !tlsOn && (o.TLSCAFile != "" || o.TLSCertFile != "" || o.TLSSkipVerify || o.TLSSkipHostname) {
		bad("TLS", "tls files, skip-verify or skip-hostname given but tls is off (use rediss:// or enable tls)")
	}
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		bad("TLSCertFile", "TLSCertFile and TLSKeyFile go together")
	}
	if o.Timeout <= 0 {
		bad("Timeout", "timeout must be positive, got %v", o.Timeout)
	}
	if o.MaxWait <= 0 {
		bad("MaxWait", "max wait must be positive, got %v", o.MaxWait)
	}
	if o.DeadlineMargin < 0 {
		bad("DeadlineMargin", "deadline margin must not be negative, got %v", o.DeadlineMargin)
	}
	if o.DialTimeout <= 0 {
		bad("DialTimeout", "dial timeout must be positive, got %v", o.DialTimeout)
	}
	if o.PoolSize < 1 {
		bad("PoolSize", "pool size must be at least 1, got %d", o.PoolSize)
	}
	if o.MinIdleConns < 0 || o.MinIdleConns > o.PoolSize {
		bad("MinIdleConns", "min idle conns must be within 0..pool size (%d), got %d", o.PoolSize, o.MinIdleConns)
	}
	if o.WaitReplicas < 0 {
		bad("WaitReplicas", "wait replicas must not be negative, got %d", o.WaitReplicas)
	}
	if o.WaitReplicas > 0 && o.Mode == Cluster {
		bad("WaitReplicas", "wait replicas is not supported in cluster mode")
	}
	if o.Pipelines < 0 {
		bad("Pipelines", "pipelines must not be negative, got %d", o.Pipelines)
	}
	if o.HealthInterval < 0 {
		bad("HealthInterval", "health interval must not be negative, got %v", o.HealthInterval)
	}
	if o.LocalCacheSize < 0 {
		bad("LocalCacheSize", "local cache size must not be negative, got %d", o.LocalCacheSize)
	}
	errs = append(errs, breakerFieldErrors(o.Breaker)...)
	return errors.Join(errs...)
}

// breakerFieldErrors is BreakerOptions.Validate field by field: each
// field of b is validated alone, among the defaults, so that each error
// names the field it is about ("Breaker.Failures").
func breakerFieldErrors(b BreakerOptions) []error {
	var errs []error
	for _, f := range []struct {
		name string
		set  func(*BreakerOptions)
	}{
		{"Failures", func(d *BreakerOptions) { d.Failures = b.Failures }},
		{"FailFor", func(d *BreakerOptions) { d.FailFor = b.FailFor }},
		{"Window", func(d *BreakerOptions) { d.Window = b.Window }},
		{"MinCalls", func(d *BreakerOptions) { d.MinCalls = b.MinCalls }},
		{"FailureRatio", func(d *BreakerOptions) { d.FailureRatio = b.FailureRatio }},
		{"OpenFor", func(d *BreakerOptions) { d.OpenFor = b.OpenFor }},
		{"Probes", func(d *BreakerOptions) { d.Probes = b.Probes }},
	} {
		d := DefaultBreakerOptions()
		d.Disabled = b.Disabled
		f.set(&d)
		if err := d.Validate(); err != nil {
			errs = append(errs, &opterr.FieldError{Package: "redis", Sentence: true, Field: "Breaker." + f.name, Reason: strings.TrimPrefix(err.Error(), "redis: ")})
		}
	}
	// Whatever the fields say together (nothing today) beyond them alone.
	if len(errs) == 0 {
		if err := b.Validate(); err != nil {
			errs = append(errs, &opterr.FieldError{Package: "redis", Sentence: true, Field: "Breaker", Reason: strings.TrimPrefix(err.Error(), "redis: ")})
		}
	}
	return errs
}

// RedactURL returns a Redis URL as logs and errors may show it: its
// password replaced by "xxxxx" ("redis://user:xxxxx@host:6379/0"), a user
// without a password (which may be a password written alone) replaced
// likewise, and every query value too. A value CheckURL refuses (with or
// without a host) is shown as "xxxxx" only: nothing of a URL that does
// not parse is ever printed, since no part of it can be told apart from
// its password.
func RedactURL(raw string) string {
	u, err := parseURL(raw)
	if err != nil {
		return redactedSecret
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redactedSecret)
		} else {
			u.User = url.User(redactedSecret)
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, url.QueryEscape(k)+"="+redactedSecret)
		}
		sort.Strings(keys)
		u.RawQuery = strings.Join(keys, "&")
	}
	return u.String()
}

// URLPassword returns the password in a Redis URL's user info ("" for
// none). For a value that does not parse it guesses (the text between the
// first ':' after the scheme and the last '@'), so that callers can scrub
// it from texts that quote the value.
func URLPassword(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		p, _ := u.User.Password()
		return p
	}
	rest := raw
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	if _, p, ok := strings.Cut(rest[:at], ":"); ok {
		return p
	}
	return ""
}

// CheckURL reports why raw is not a Redis URL ratelimitd accepts, nil when
// it is: scheme redis://, rediss:// or unix://, in the hierarchical form
// (scheme://[user[:password]@]host[:port][/db][?option=value]), no
// fragment, and what go-redis parses. needHost refuses a redis:// or
// rediss:// URL without a host (standalone mode dials it; sentinel and
// cluster take only the credentials, TLS and DB from the URL). The error
// never quotes the URL or any part of it: it is one of a fixed set of
// reasons.
func CheckURL(raw string, needHost bool) error {
	u, err := parseURL(raw)
	if err != nil {
		return err
	}
	if needHost && u.Scheme != "unix" && u.Hostname() == "" {
		return errURLNoHost
	}
	return nil
}

// parseURL parses raw as CheckURL describes, without the host check.
func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, urlReason(err)
	}
	switch u.Scheme {
	case "redis", "rediss", "unix":
	case "":
		return nil, errors.New("has no scheme (want redis://, rediss:// or unix://)")
	default:
		return nil, errors.New("has an unknown scheme (want redis://, rediss:// or unix://)")
	}
	if u.Opaque != "" || !strings.HasPrefix(raw[len(u.Scheme)+1:], "//") {
		return nil, errors.New("is not of the form scheme://host:port/db (credentials before the host)")
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return nil, errors.New("has a fragment (#)")
	}
	if u.Scheme == "unix" && u.Host != "" {
		return nil, errors.New("unix:// takes a path, not a host (unix:///path/to/socket)")
	}
	if _, err := goredis.ParseURL(raw); err != nil {
		return nil, urlReason(err)
	}
	if p := u.Port(); p != "" {
		// net/url accepts any digits; a port outside 1..65535 would only
		// fail every dial later, so it is refused here.
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, errURLPort
		}
	}
	return u, nil
}

var errURLPort = errors.New("has a port outside 1..65535")

var errURLNoHost = errors.New("has no host (want scheme://host:port/db)")

// urlReasons are the reasons net/url and go-redis give, by prefix of
// their error text, worded without the part of the URL they quote.
var urlReasons = []struct{ prefix, reason string }{
	{"missing protocol scheme", "has no scheme (want redis://, rediss:// or unix://)"},
	{"first path segment in URL cannot contain colon", "has no scheme (want redis://, rediss:// or unix://)"},
	{"net/url: invalid control character", "holds a control character"},
	{"invalid control character", "holds a control character"},
	{"invalid URL escape", "holds an invalid %-escape"},
	{"invalid character", "holds a character not allowed in a host name"},
	{"invalid port", "has an invalid port"},
	{"invalid host", "has an invalid host"},
	{"invalid IP-literal", "has an invalid IPv6 host"},
	{"missing ']' in host", "has an invalid IPv6 host"},
	{"net/url: invalid userinfo", "has invalid user info"},
	{"invalid semicolon separator in query", "has an invalid query"},
	{"number of URL query parameters exceeded limit", "has an invalid query"},
	{"redis: invalid URL scheme", "has an unknown scheme (want redis://, rediss:// or unix://)"},
	{"redis: invalid database number", "has an invalid database number (want /0, /1, ...)"},
	{"redis: invalid URL path", "has an invalid path (want /db)"},
	{"redis: unexpected option", "has an unknown query option"},
	{"redis: empty unix socket path", "has no unix socket path"},
	{"redis: invalid", "has an invalid query option value"},
}

// urlReason maps a net/url or go-redis error to a fixed reason
// (urlReasons), never to a text that holds a part of the URL.
func urlReason(err error) error {
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = ue.Err.Error()
	}
	for _, r := range urlReasons {
		if strings.HasPrefix(msg, r.prefix) {
			return errors.New(r.reason)
		}
	}
	return errors.New("does not parse")
}

// redactedSecret replaces a password in everything the backend prints.
const redactedSecret = "xxxxx"

// urlError describes a Redis URL that CheckURL refused: the reason only,
// never the URL or a part of it (net/url and go-redis quote the URL, or
// the part they stumbled on, which may be the user info).
func urlError(err error) string {
	return "url (not shown: it may hold a password) " + err.Error()
}
