package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// Options is everything `ratelimitd serve` reads from its command line and
// environment, validated. Each field with a flag is one entry of the
// settings table (settings.go: flag, environment twin
// RATELIMITD_<FLAG_IN_UPPER_SNAKE>, envoyproxy/ratelimit variables,
// default, doc line; docs/flags.md lists them). Precedence: flag >
// RATELIMITD_* > legacy variable > default.
type Options struct {
	Config []string // YAML files or directories (watched); read with ConfigSource "file" only
	// ConfigSource is where configs come from: "file" (Config) or "xds"
	// (the management server of the XDS* fields, envoyproxy/ratelimit
	// CONFIG_TYPE=GRPC_XDS_SOTW; docs/xds.md).
	ConfigSource string
	// xDS client (pkg/policy/xds.Options): server gRPC target, node id and
	// metadata ("key=value,..."), extra gRPC metadata on the stream
	// ("name:value,..."; may hold credentials, never logged), the wait
	// between connection attempts, TLS (PEM files; SAN is the name the
	// server certificate must carry), the reconnect backoff and the
	// largest response in bytes (0: gRPC's 4 MiB).
	XDSServerURL            string
	XDSNodeID               string        // --xds-node-id
	XDSNodeMetadata         string        // --xds-node-metadata
	XDSHeaders              string        // --xds-headers
	XDSConnectRetryInterval time.Duration // --xds-connect-retry-interval
	XDSTLS                  bool          // --xds-tls
	XDSTLSCert              string        // --xds-tls-cert
	XDSTLSKey               string        // --xds-tls-key
	XDSTLSCA                string        // --xds-tls-ca
	XDSTLSSAN               string        // --xds-tls-san
	XDSBackoffInitial       time.Duration // --xds-backoff-initial
	XDSBackoffMax           time.Duration // --xds-backoff-max
	XDSBackoffRandomFactor  float64       // --xds-backoff-random-factor
	XDSBackoffJitter        bool          // --xds-backoff-jitter
	XDSMaxMsgSize           int           // --xds-max-msg-size

	GRPCAddr  string // host:port of the Envoy RLS v3 gRPC server
	HTTPAddr  string // host:port of /healthcheck, /json, /metrics
	DebugAddr string // host:port of /rlconfig, /debug/pprof/; "" disables
	// MetricsAddr, when set, also serves /metrics on its own listener
	// (envoyproxy/ratelimit PROMETHEUS_ADDR); "" = only on HTTPAddr.
	MetricsAddr string

	Backend      string        // "memory", "redis" or "memcache" ("memcached" is read as "memcache")
	RedisURL     string        // redis:// or rediss://, user:password@ for ACL
	RedisMode    string        // "standalone", "cluster" or "sentinel"
	RedisAddrs   []string      // --redis-addrs
	RedisMaster  string        // --redis-master
	RedisTimeout time.Duration // Redis silence taken as a failure (redis.Options.Timeout)
	// RedisMaxWait and RedisDeadlineMargin are redis.Options.MaxWait and
	// DeadlineMargin: a call's budget without, and before, the caller's
	// deadline. RedisWarmup bounds the warm-up before health SERVING (0:
	// no warm-up).
	RedisMaxWait        time.Duration
	RedisDeadlineMargin time.Duration // --redis-deadline-margin
	RedisWarmup         time.Duration // --redis-warmup
	RedisWaitReplicas   int           // redis.Options.WaitReplicas
	RedisPoolSize       int           // connections; 0 = the store's default
	LocalCacheSize      int           // over-limit cache entries; 0 disables
	// Redis pool, batching and health tuning: redis.Options.DialTimeout,
	// MinIdleConns (capped at the pool size), Pipelines and
	// HealthInterval (0 disables the probe).
	RedisDialTimeout    time.Duration
	RedisMinIdleConns   int           // --redis-min-idle-conns
	RedisPipelines      int           // --redis-pipelines
	RedisHealthInterval time.Duration // --redis-health-interval
	// The Redis circuit breaker (redis.BreakerOptions). RedisBreaker false
	// disables it (every call goes to Redis); the other fields are then
	// not validated.
	RedisBreaker             bool
	RedisBreakerFailures     int           // --redis-breaker-failures
	RedisBreakerFailFor      time.Duration // --redis-breaker-fail-for
	RedisBreakerWindow       time.Duration // --redis-breaker-window
	RedisBreakerMinCalls     int           // --redis-breaker-min-calls
	RedisBreakerFailureRatio float64       // --redis-breaker-failure-ratio
	RedisBreakerOpenFor      time.Duration // --redis-breaker-open-for
	RedisBreakerProbes       int           // --redis-breaker-probes
	// Redis TLS files (PEM) and options; rediss:// turns TLS on.
	RedisTLSCA         string
	RedisTLSCert       string // --redis-tls-cert
	RedisTLSKey        string // --redis-tls-key
	RedisTLSSkipVerify bool   // --redis-tls-skip-verify
	// RedisSentinelAuth authenticates to the sentinels: "password" or
	// "user:password".
	RedisSentinelAuth string

	// The memcached backend (memcache.Options): servers as host:port
	// (MemcacheAddrs) or from an SRV record (MemcacheSRV, resolved again
	// every MemcacheSRVRefresh; 0: once), idle connections kept per
	// server, and the bound of each call.
	MemcacheAddrs        []string
	MemcacheSRV          string        // --memcache-srv
	MemcacheSRVRefresh   time.Duration // --memcache-srv-refresh
	MemcacheMaxIdleConns int           // --memcache-max-idle-conns
	MemcacheTimeout      time.Duration // --memcache-timeout

	ShadowMode bool // --shadow-mode
	QuotaMode  bool // --quota-mode
	// Counting is the global counting policy (service.Options.Counting):
	// "all_or_nothing" (default) or "always_charge" (envoyproxy/ratelimit's
	// counting, the one to set for envoyproxy/ratelimit compatibility).
	Counting         string
	LogLevel         string        // debug, info, warn, error
	LogFormat        string        // text or json
	MergeDomains     bool          // --merge-domains
	IgnoreDotfiles   bool          // --ignore-dotfiles
	KeyPrefix        string        // --key-prefix
	KeyValues        string        // "hash" or "clear" (development only)
	Headers          string        // ietf, legacy, both or none
	NearLimitRatio   float64       // --near-limit-ratio
	RetryJitter      time.Duration // maximum jitter added to Retry-After
	RequestOverrides bool          // --request-overrides
	DynamicMetadata  bool          // --dynamic-metadata
	// NearLimitHeader adds Ratelimitd-Near-Limit (service.Options).
	NearLimitHeader bool
	// ProblemTypeBase prefixes the RFC 9457 problem type names.
	ProblemTypeBase string
	// ProblemDetail is the problem "detail" template ("" = built-in).
	ProblemDetail string
	// DetailedMetricCap bounds detailed_metric rule label values per
	// loaded config; negative disables detailed labels.
	DetailedMetricCap int
	// FailClosedRetryAfter is the Retry-After base of a failure_mode:
	// closed denial.
	FailClosedRetryAfter time.Duration

	// The decision log (service.Options.DecisionLog): off, denied or
	// all, at most LogDecisionsRate lines per second.
	LogDecisions     string
	LogDecisionsRate float64 // --log-decisions-rate

	// MemoryMaxKeys bounds the keys of the in-memory store (the memory
	// backend, and the failure_mode: local fallback of the Redis
	// backend); 0 = unbounded. A request needing a new key beyond it
	// drops an expired key, or, when none has expired, fails with
	// memory.ErrFull (cause "oom"): its rule's failure mode decides.
	MemoryMaxKeys int
	// MaxConfigRules is the most rules a loaded config may hold, at
	// startup and at every reload; a larger config is refused and the
	// config in force stays. 0 means no limit.
	MaxConfigRules int
	// MaxConfigBytes is the most bytes the config files may hold together,
	// checked before parsing, at startup and at every reload. 0 means no
	// limit.
	MaxConfigBytes int64

	// GCPercent is the Go GC target (debug.SetGCPercent) unless GOGC is
	// set; -1 turns the GC off and is accepted only with a memory limit.
	GCPercent int
	// MemoryLimit is the Go soft memory limit in bytes
	// (debug.SetMemoryLimit) unless GOMEMLIMIT is set; 0 derives it from
	// the cgroup memory limit times MemoryLimitRatio (0: no limit).
	MemoryLimit      byteSize
	MemoryLimitRatio float64 // --memory-limit-ratio

	// Drain is how long the health checks report NOT_SERVING before the
	// listeners stop accepting (lets load balancers notice).
	Drain time.Duration
	// ShutdownGrace bounds the wait for in-flight calls after the
	// listeners stop; calls still running then are cut.
	ShutdownGrace time.Duration

	// gRPC server TLS (empty = plaintext). ClientCA turns on mTLS; ClientSAN
	// additionally requires that SAN (DNS, URI, IP or e-mail) in the client
	// certificate.
	GRPCTLSCert      string
	GRPCTLSKey       string // --grpc-tls-key
	GRPCTLSClientCA  string // --grpc-tls-client-ca
	GRPCTLSClientSAN string // --grpc-tls-client-san
	// HTTPTLS serves the HTTP listener (/healthcheck, /json, /metrics) with
	// the gRPC listener's TLS material; needs GRPCTLSCert. When gRPC uses
	// TLS and HTTPTLS is false, POST /json is off (docs/security.md, "Trust
	// boundaries").
	HTTPTLS bool
	// DebugTokenFile names a file holding the bearer token that admits
	// non-loopback connections to the debug listener ("" = loopback
	// connections only).
	DebugTokenFile string
	// RedisPasswordFile names a file holding the Redis password, read on
	// every new connection (wins over the URL's password).
	// RedisSentinelAuthFile names a file holding --redis-sentinel-auth's
	// value, read at startup.
	RedisPasswordFile     string
	RedisSentinelAuthFile string // --redis-sentinel-auth-file

	// Resource bounds of the listeners (docs/security.md, "Resource
	// bounds"). GRPCMaxRecvMsgSize is the largest gRPC message received,
	// in bytes (a larger one fails with ResourceExhausted before it is
	// decoded); it also bounds the POST /json body (413 beyond it).
	// GRPCMaxConcurrentStreams is the streams one HTTP/2 connection may
	// have open at once (further calls wait for one to end).
	// GRPCMaxConnections is the gRPC connections open at once (0:
	// unbounded); beyond it new connections wait to be accepted.
	GRPCMaxRecvMsgSize       int
	GRPCMaxConcurrentStreams int // --grpc-max-concurrent-streams
	GRPCMaxConnections       int // --grpc-max-connections
	// GRPCMaxConnectionAge is how long a gRPC client connection may live
	// before the server sends it GOAWAY (keepalive.ServerParameters
	// MaxConnectionAge; grpc-go adds ±10% jitter), so that Envoy's
	// long-lived HTTP/2 connections spread over replicas added later;
	// 0 = never. GRPCMaxConnectionAgeGrace is how long calls in flight on
	// such a connection may still run before it is closed
	// (MaxConnectionAgeGrace); 0 = no bound. envoyproxy/ratelimit
	// GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE.
	GRPCMaxConnectionAge      time.Duration
	GRPCMaxConnectionAgeGrace time.Duration // --grpc-max-connection-age-grace
	// HTTP servers: HTTPReadTimeout bounds reading a whole request
	// (headers and body), HTTPWriteTimeout the time from the end of the
	// request headers to the end of the response (not on the debug
	// listener, whose profiles take longer), HTTPIdleTimeout how long a
	// keep-alive connection may wait for its next request. All > 0.
	HTTPReadTimeout  time.Duration
	HTTPWriteTimeout time.Duration // --http-write-timeout
	HTTPIdleTimeout  time.Duration // --http-idle-timeout

	// OpenTelemetry tracing (off by default): OTLP/gRPC export to
	// TracingEndpoint (empty = OTEL_EXPORTER_OTLP_* environment, else
	// localhost:4317); W3C trace context from Envoy is continued.
	Tracing            bool
	TracingEndpoint    string  // --tracing-endpoint
	TracingInsecure    bool    // --tracing-insecure
	TracingSampleRatio float64 // --tracing-sample-ratio
	TracingServiceName string  // --tracing-service-name

	// StatsdAddr, when set, sends envoyproxy/ratelimit's statsd stats
	// over UDP to this host:port (docs/metrics.md, "statsd (reference
	// names)"); "" sends none. Prometheus is unaffected.
	StatsdAddr string
	// StatsdFlushInterval is how often statsd counters and gauges are
	// sent (envoyproxy/ratelimit STATS_FLUSH_INTERVAL); > 0.
	StatsdFlushInterval time.Duration
	// StatsdTags are tags appended to every statsd stat name as
	// github.com/lyft/gostats serializes them (".__key=value", sorted by
	// key; envoyproxy/ratelimit EXTRA_TAGS): "key:value" items separated
	// by ',' (each item exactly one ':'); "" means none.
	StatsdTags string
	// StatsdReferenceAddr is where envoyproxy/ratelimit itself would send
	// statsd stats with the environment as it is: STATSD_HOST:STATSD_PORT
	// (defaults localhost:8125) when USE_STATSD is unset, since its
	// default is true; "" when USE_STATSD, DISABLE_STATS, USE_PROMETHEUS or
	// USE_DOG_STATSD rules it out. Set by applyLegacyEnv, no flag. It is
	// not used unless useReferenceStatsd is called (reference-mode
	// wiring): ratelimitd itself sends statsd only when asked to
	// explicitly (USE_STATSD=true or --statsd-addr).
	StatsdReferenceAddr string

	// Mode is --mode: auto (reference mode when the environment is
	// envoyproxy/ratelimit's, see resolveMode), reference or native.
	Mode string
	// Reference is the mode in force after resolveMode: true in
	// reference mode.
	Reference bool
	// ProblemBody sends Retry-After, Content-Type and the RFC 9457
	// problem body on OVER_LIMIT (service.Options.OmitProblem inverted);
	// false in reference mode unless --problem-body is given.
	ProblemBody bool
	// Legacy header names (service.LegacyHeaderNames): --headers=legacy
	// or both. envoyproxy/ratelimit's LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER set them.
	LegacyLimitHeader     string
	LegacyRemainingHeader string // --legacy-remaining-header
	LegacyResetHeader     string // --legacy-reset-header
	// ReferenceAnswers is service.Options.ReferenceAnswers (set in
	// reference mode).
	ReferenceAnswers bool

	// ReferenceCounting is set in reference mode, whose --counting
	// default is the reference's counting (applyReferenceDefaults):
	// always_charge, or all_or_nothing with StopIncrementWhenOverLimit
	// (envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
	// default false: a request some of whose limits would go over is
	// charged only to those limits).
	ReferenceCounting          bool
	StopIncrementWhenOverLimit bool // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (no flag)

	// modeReason says why the mode in force was chosen (startup log).
	modeReason string
	// legacySeen records the envoyproxy/ratelimit variables found set.
	legacySeen legacySeen

	// fromEnv maps the name of each flag whose value came from its
	// RATELIMITD_* twin (not overridden on the command line) to that
	// variable, so that errors name where a bad value was set.
	fromEnv map[string]string
}

// useReferenceStatsd turns statsd on at StatsdReferenceAddr when no
// address was given, as envoyproxy/ratelimit does when USE_STATSD is
// unset (its default is true). For reference-mode wiring; call it after
// the flags are parsed.
func (o *Options) useReferenceStatsd() {
	if o.StatsdAddr == "" {
		o.StatsdAddr = o.StatsdReferenceAddr
	}
}

// defaultGRPCMaxRecvMsgSize is the default --grpc-max-recv-msg-size,
// 1 MiB. Envoy builds a RateLimitRequest from route actions, one entry per
// action, whose values are header values, paths or addresses: a request
// holding every header of a request Envoy accepts by default
// (max_request_headers_kb: 60 KiB) once is below 64 KiB, and 1 MiB leaves
// room for 16 such copies, or 16 values of the MaxValueBytes bound. The
// bounds of validateRequest (64 descriptors x 32 entries x 64 KiB) would
// allow far more than grpc-go's 4 MiB, so that shape does not bound a
// message; this does, before any of it is decoded.
const defaultGRPCMaxRecvMsgSize = 1 << 20

// defaultGRPCMaxConcurrentStreams is the default
// --grpc-max-concurrent-streams: calls one HTTP/2 connection may have in
// flight. An Envoy worker thread keeps one connection per cluster host
// and its calls last a few milliseconds; at 1000 in flight per
// connection it would make ~100,000 decisions per second at 10 ms each.
const defaultGRPCMaxConcurrentStreams = 1000

// defaultGRPCMaxConnectionAge is the default --grpc-max-connection-age.
// envoyproxy/ratelimit defaults to 24h, which keeps an Envoy's
// connections on the replicas that were up when it started for a day:
// replicas a HorizontalPodAutoscaler adds get no traffic from existing
// Envoys. After 5 minutes (±10% jitter from grpc-go) each connection is
// sent GOAWAY and Envoy opens a new one, balanced over the current
// endpoints; at one new HTTP/2 connection per Envoy worker every 5
// minutes the cost is negligible.
const defaultGRPCMaxConnectionAge = 5 * time.Minute

// defaultGRPCMaxConnectionAgeGrace is the default
// --grpc-max-connection-age-grace: calls in flight when GOAWAY is sent
// may run this long before the connection is closed. A ShouldRateLimit
// call lasts milliseconds (Envoy's filter timeout is 20 ms by default);
// 30 s also lets a health Watch stream or reflection session end on its
// own terms in most cases (envoyproxy/ratelimit: 1h).
const defaultGRPCMaxConnectionAgeGrace = 30 * time.Second

// listValue is a repeatable/comma-separated string list flag. The first Set
// from each source (environment, then command line) replaces the value
// inherited from the previous source; later Sets of the same source append.
type listValue struct {
	p       *[]string
	touched bool
}

func (v *listValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v *listValue) Set(s string) error {
	if !v.touched {
		*v.p = nil
		v.touched = true
	}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*v.p = append(*v.p, part)
		}
	}
	return nil
}

// envName is the RATELIMITD_* twin of a flag: "redis-url" → "RATELIMITD_REDIS_URL".
func envName(flagName string) string {
	return "RATELIMITD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseServe turns serve's arguments and the environment into validated
// Options. getenv is os.LookupEnv in production. Warnings are non-fatal
// remarks for the startup log (at most one line naming every unsupported
// envoyproxy/ratelimit variable). Errors name the offending flag or
// variable; flag.ErrHelp is returned for -h.
func parseServe(args []string, lookup func(string) (string, bool), usage io.Writer) (Options, []string, error) {
	return parseServeAs(false, args, lookup, usage)
}

// parseServeAs is parseServe for a binary invoked as envoyproxy/ratelimit's
// (asRef: its name is ratelimit), which selects reference mode under
// --mode=auto.
func parseServeAs(asRef bool, args []string, lookup func(string) (string, bool), usage io.Writer) (Options, []string, error) {
	o := defaultOptions()
	warnings, err := applyLegacyEnv(&o, lookup)
	if err != nil {
		return o, warnings, scrubErr(err, legacySecrets(o, lookup)...)
	}
	explicit, err := parseFlagsAndTwins(&o, args, lookup, usage)
	if err != nil {
		return o, warnings, err
	}
	if err := resolveMode(&o, explicit, asRef, lookup); err != nil {
		return o, warnings, o.annotateEnv(err)
	}
	if o.Reference {
		warnings = referenceWarnings(warnings)
	}
	if err := o.checkBackendChosen(explicit); err != nil {
		return o, warnings, o.annotateEnv(err)
	}
	if err := o.Validate(); err != nil {
		return o, warnings, o.annotateEnv(scrubErr(err, secretsOf(o)...))
	}
	if o.RedisSentinelAuthFile != "" {
		auth, err := readSecretFile("redis-sentinel-auth-file", o.RedisSentinelAuthFile)
		if err != nil {
			return o, warnings, o.annotateEnv(err)
		}
		o.RedisSentinelAuth = auth
	}
	return o, warnings, nil
}

// legacySecrets are the credentials of o and of the reference's variables
// (REDIS_AUTH, REDIS_SENTINEL_AUTH, a REDIS_URL with user info): none is
// quoted back in an error.
func legacySecrets(o Options, lookup func(string) (string, bool)) []string {
	secrets := secretsOf(o)
	for _, name := range []string{"REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_URL"} {
		if v, ok := lookup(name); ok {
			v = strings.TrimSpace(v)
			secrets = append(secrets, redis.URLPassword(v))
			if name != "REDIS_URL" {
				secrets = append(secrets, v)
				if _, p, ok := strings.Cut(v, ":"); ok {
					secrets = append(secrets, p)
				}
			}
		}
	}
	return secrets
}

// parseFlagsAndTwins sets o from the RATELIMITD_* twins, then from args
// (the flag wins), normalizes the spellings, and records in o.fromEnv the
// flags whose value came from a twin. It returns the flags set on the
// command line or by a twin; flag.ErrHelp (usage printed) for -h.
func parseFlagsAndTwins(o *Options, args []string, lookup func(string) (string, bool), usage io.Writer) (map[string]bool, error) {
	fs := flag.NewFlagSet("ratelimitd serve", flag.ContinueOnError)
	// The flag package prints a parse error and the whole usage itself;
	// the caller prints the error once with a short hint instead, and the
	// usage goes out only for -h.
	fs.SetOutput(io.Discard)
	lists := registerServeFlags(fs, o)
	durErr, restoreDurations := clearDurationErrors(fs)
	fs.Usage = func() {}
	envValues, err := setTwins(fs, lists, lookup)
	if err != nil {
		return nil, err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(usage, "Usage: ratelimitd serve [flags]\n\nEvery flag has an environment twin RATELIMITD_<FLAG> (the flag wins).\n\nFlags:\n")
			fs.SetOutput(usage)
			restoreDurations()
			fs.PrintDefaults()
		}
		if *durErr != nil {
			// "--redis-timeout=10: missing unit (e.g. 10ms or 10s)",
			// not the flag package's "parse error".
			err = *durErr
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("serve takes no arguments, got %q (use --config)", fs.Args())
	}
	o.normalizeSpellings()
	for name, v := range envValues {
		if fs.Lookup(name).Value.String() == v {
			if o.fromEnv == nil {
				o.fromEnv = map[string]string{}
			}
			o.fromEnv[name] = envName(name)
		}
	}
	explicit := map[string]bool{} // set on the command line or by a twin
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	return explicit, nil
}

// setTwins sets every flag of fs whose RATELIMITD_* twin is set, and
// returns each such flag's value as the twin set it (a list flag set by
// its twin is then replaced, not extended, by the command line). Every
// malformed twin is reported, as NAME="value": error.
func setTwins(fs *flag.FlagSet, lists []*listValue, lookup func(string) (string, bool)) (map[string]string, error) {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		if v, ok := lookup(name); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, l := range lists {
		l.touched = false
	}
	envValues := map[string]string{} // flag name → its value as set from the twin
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := lookup(envName(f.Name)); ok {
			envValues[f.Name] = f.Value.String()
		}
	})
	return envValues, nil
}

// normalizeSpellings lowers the case of --log-level (RATELIMITD_LOG_LEVEL=
// DEBUG; "warning" is warn) and --log-format, and reads
// --backend=memcached as memcache.
func (o *Options) normalizeSpellings() {
	o.LogLevel = strings.ToLower(strings.TrimSpace(o.LogLevel))
	if o.LogLevel == "warning" {
		o.LogLevel = "warn"
	}
	o.LogFormat = strings.ToLower(strings.TrimSpace(o.LogFormat))
	if o.Backend == "memcached" {
		o.Backend = "memcache"
	}
}

// annotateEnv returns err with every line that starts with a flag whose
// value came from its environment twin ("--gc-percent=-1: ...") followed
// by " (set by RATELIMITD_GC_PERCENT)"; nil stays nil.
func (o Options) annotateEnv(err error) error {
	if err == nil || len(o.fromEnv) == 0 {
		return err
	}
	lines := strings.Split(err.Error(), "\n")
	changed := false
	for i, l := range lines {
		rest, ok := strings.CutPrefix(l, "--")
		if !ok {
			continue
		}
		end := strings.IndexFunc(rest, func(r rune) bool { return r != '-' && (r < 'a' || r > 'z') && (r < '0' || r > '9') })
		if end < 0 {
			end = len(rest)
		}
		if v, ok := o.fromEnv[rest[:end]]; ok {
			lines[i] = l + " (set by " + v + ")"
			changed = true
		}
	}
	if !changed {
		return err
	}
	return fmt.Errorf("%s", strings.Join(lines, "\n"))
}

// nonFlagVariables are RATELIMITD_* variables read by the project's tests
// and scripts, not by `serve`; they are not reported as unknown.
var nonFlagVariables = map[string]bool{
	"RATELIMITD_REQUIRE_REDIS":           true,
	"RATELIMITD_SERVICE_REFERENCE_STORE": true,
	"RATELIMITD_BENCH_TIMEOUT":           true,
	"RATELIMITD_BENCH_POOL":              true,
}

// unknownTwins returns the one startup warning naming every RATELIMITD_*
// variable of environ ("NAME=value" entries, as os.Environ returns) that is
// the twin of no serve flag (a typo such as RATELIMITD_REDIS_ULR would
// otherwise be ignored silently), or "" when there is none.
func unknownTwins(environ []string) string {
	o := defaultOptions()
	fs := flag.NewFlagSet("twins", flag.ContinueOnError)
	registerServeFlags(fs, &o)
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = true })
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "RATELIMITD_") && !known[name] && !nonFlagVariables[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return ""
	}
	sort.Strings(unknown)
	return "RATELIMITD_* environment variables that match no serve flag (ignored; misspelled?): " + strings.Join(unknown, ", ")
}

func oneOf(name, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("--%s=%q: want one of %s", name, v, strings.Join(allowed, ", "))
}

func checkAddr(name, v string, optional bool) error {
	if v == "" && optional {
		return nil
	}
	if _, _, err := net.SplitHostPort(v); err != nil {
		return fmt.Errorf("--%s=%q: %w", name, v, err)
	}
	return nil
}

// Validate reports every invalid field at once: the command's own rules
// (validateSources, validateSpellings, validateBounds, validateServing),
// then the redis, memcache and service packages' rules on the options
// the flags build (validateOwners), each error naming the flag, at most
// one per flag.
func (o Options) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	o.validateSources(add)
	o.validateSpellings(add)
	o.validateBounds(add)
	o.validateServing(add)
	add(o.validateOwners(flagsNamed(errs)))
	return errors.Join(errs...)
}

// flagsNamed returns the flags that lines of errs begin with ("--name=",
// "--name:" or "--name ").
func flagsNamed(errs []error) map[string]bool {
	named := map[string]bool{}
	for _, e := range errs {
		for _, line := range strings.Split(e.Error(), "\n") {
			if rest, ok := strings.CutPrefix(line, "--"); ok {
				if f := strings.FieldsFunc(rest, func(r rune) bool { return r == '=' || r == ' ' || r == ':' }); len(f) > 0 {
					named[f[0]] = true
				}
			}
		}
	}
	return named
}

// validateSources checks the config source and the listen and statsd addresses.
func (o Options) validateSources(add func(error)) {
	add(oneOf("config-source", o.ConfigSource, "file", "xds"))
	if len(o.Config) == 0 && o.ConfigSource != "xds" {
		add(errors.New("--config: at least one path is required"))
	}
	if o.ConfigSource == "xds" {
		add(o.validateXDS())
	}
	add(checkAddr("grpc-addr", o.GRPCAddr, false))
	add(checkAddr("http-addr", o.HTTPAddr, false))
	add(checkAddr("debug-addr", o.DebugAddr, true))
	add(checkAddr("metrics-addr", o.MetricsAddr, true))
	add(checkAddr("statsd-addr", o.StatsdAddr, true))
	if _, err := parseStatsdTags(o.StatsdTags); err != nil {
		add(err)
	}
	if o.StatsdFlushInterval <= 0 {
		add(fmt.Errorf("--statsd-flush-interval=%s: must be > 0", o.StatsdFlushInterval))
	}
}

// validateSpellings checks the flags that take one of a set of words, and the legacy header names.
func (o Options) validateSpellings(add func(error)) {
	add(oneOf("backend", o.Backend, "memory", "redis", "memcache"))
	add(oneOf("redis-mode", o.RedisMode, "standalone", "cluster", "sentinel"))
	add(oneOf("log-level", o.LogLevel, "debug", "info", "warn", "error"))
	add(oneOf("log-format", o.LogFormat, "text", "json"))
	add(oneOf("key-values", o.KeyValues, "hash", "clear"))
	add(oneOf("headers", o.Headers, "ietf", "legacy", "both", "none"))
	add(oneOf("counting", o.Counting, "all_or_nothing", "always_charge"))
	add(oneOf("mode", o.Mode, modeAuto, modeReference, modeNative))
	for _, h := range []struct{ name, v string }{
		{"legacy-limit-header", o.LegacyLimitHeader}, {"legacy-remaining-header", o.LegacyRemainingHeader}, {"legacy-reset-header", o.LegacyResetHeader},
	} {
		if !validHeaderName(h.v) {
			add(fmt.Errorf("--%s=%q: not an HTTP header name (RFC 9110 token)", h.name, h.v))
		}
	}
	add(o.validateDecisionLog())
}

// validateBounds checks the numbers the command reads itself (store, GC, answers, config bounds).
func (o Options) validateBounds(add func(error)) {
	// Flag values that the packages read as their defaults are refused
	// here (the flag's default is spelled out instead); the packages'
	// own ranges are theirs (validateOwners, at the end).
	notNegative(add, "redis-pool-size", o.RedisPoolSize, "the store's default")
	if o.RedisWarmup < 0 {
		add(fmt.Errorf("--redis-warmup=%s: must be >= 0 (0: no warm-up)", o.RedisWarmup))
	}
	if o.GCPercent < -1 {
		add(fmt.Errorf("--gc-percent=%d: must be >= 0, or -1 (off, with a memory limit)", o.GCPercent))
	}
	if o.MemoryLimit < 0 {
		add(fmt.Errorf("--memory-limit=%d: must be >= 0", o.MemoryLimit))
	}
	if !(o.MemoryLimitRatio >= 0 && o.MemoryLimitRatio <= 1) {
		add(fmt.Errorf("--memory-limit-ratio=%v: must be in [0, 1] (0: no limit from the cgroup)", o.MemoryLimitRatio))
	}
	if o.NearLimitRatio == 0 {
		add(errors.New("--near-limit-ratio=0: must be in (0, 1]"))
	}
	if o.RetryJitter < 0 {
		add(fmt.Errorf("--retry-jitter=%s: must be >= 0", o.RetryJitter))
	}
	if o.FailClosedRetryAfter == 0 {
		add(errors.New("--fail-closed-retry-after=0s: must be > 0"))
	}
	if o.DetailedMetricCap == 0 {
		add(errors.New("--detailed-metric-cap=0: want > 0, or negative to disable detailed labels"))
	}
	notNegative(add, "memory-max-keys", o.MemoryMaxKeys, "unbounded")
	notNegative(add, "max-config-rules", o.MaxConfigRules, "no limit")
	notNegative(add, "max-config-bytes", o.MaxConfigBytes, "no limit")
}

// validateServing checks shutdown, TLS, secrets files and the listeners' resource bounds.
func (o Options) validateServing(add func(error)) {
	if o.Drain < 0 || o.ShutdownGrace < 0 {
		add(errors.New("--drain and --shutdown-grace must be >= 0"))
	}
	if (o.GRPCTLSCert == "") != (o.GRPCTLSKey == "") {
		add(errors.New("--grpc-tls-cert and --grpc-tls-key go together"))
	}
	if o.GRPCTLSClientCA != "" && o.GRPCTLSCert == "" {
		add(errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key"))
	}
	if o.GRPCTLSClientSAN != "" && o.GRPCTLSClientCA == "" {
		add(errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca"))
	}
	if o.HTTPTLS && o.GRPCTLSCert == "" {
		add(errors.New("--http-tls serves the gRPC certificate: it needs --grpc-tls-cert and --grpc-tls-key"))
	}
	if o.DebugTokenFile != "" {
		if _, err := readSecretFile("debug-token-file", o.DebugTokenFile); err != nil {
			add(err)
		}
	}
	if o.RedisSentinelAuthFile != "" && o.RedisSentinelAuth != "" {
		add(errors.New("--redis-sentinel-auth and --redis-sentinel-auth-file: give one"))
	}
	if o.GRPCMaxRecvMsgSize <= 0 {
		add(fmt.Errorf("--grpc-max-recv-msg-size=%d: must be > 0 (bytes)", o.GRPCMaxRecvMsgSize))
	}
	if o.GRPCMaxConcurrentStreams <= 0 || int64(o.GRPCMaxConcurrentStreams) > math.MaxUint32 {
		add(fmt.Errorf("--grpc-max-concurrent-streams=%d: must be in [1, %d]", o.GRPCMaxConcurrentStreams, uint32(math.MaxUint32)))
	}
	notNegative(add, "grpc-max-connections", o.GRPCMaxConnections, "unbounded")
	notNegative(add, "grpc-max-connection-age", o.GRPCMaxConnectionAge, "never")
	notNegative(add, "grpc-max-connection-age-grace", o.GRPCMaxConnectionAgeGrace, "no bound")
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"http-read-timeout", o.HTTPReadTimeout}, {"http-write-timeout", o.HTTPWriteTimeout}, {"http-idle-timeout", o.HTTPIdleTimeout}} {
		if d.v <= 0 {
			add(fmt.Errorf("--%s=%s: must be > 0", d.name, d.v))
		}
	}
}

// validHeaderName reports whether s is an RFC 9110 field name (a token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// sortedKeys is a small helper for deterministic messages.
func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

var _ = os.LookupEnv // production lookup (main.go)

// checkBackendChosen refuses Redis flags given while the backend is the
// in-memory store by default: every replica would count alone (N replicas
// admit N times a limit) although the operator pointed ratelimitd at a
// Redis. explicit holds the flags set on the command line or by their
// twins; --backend=memory given explicitly keeps the memory store.
func (o Options) checkBackendChosen(explicit map[string]bool) error {
	if o.Backend != "memory" || explicit["backend"] {
		return nil
	}
	for _, f := range []string{"redis-url", "redis-mode", "redis-addrs", "redis-master", "redis-password-file"} {
		if explicit[f] {
			return fmt.Errorf("--%s is set but the backend is the in-memory store (--backend defaults to memory): add --backend=redis, or --backend=memory to count in this process only", f)
		}
	}
	return nil
}

// parseStatsdTags parses --statsd-tags ("k1:v1,k2:v2", as
// envoyproxy/ratelimit's EXTRA_TAGS is parsed: items split on ',', each
// split on ':' into exactly two parts, nothing trimmed, a later key
// replacing an earlier one). "" (or only spaces) is no tags.
func parseStatsdTags(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	tags := make(map[string]string)
	for _, item := range strings.Split(s, ",") {
		kv := strings.Split(item, ":")
		if len(kv) != 2 {
			return nil, fmt.Errorf("--statsd-tags: item %q: want key:value", item)
		}
		tags[kv[0]] = kv[1]
	}
	return tags, nil
}

// notNegative adds "--<flag>=<v>: must be >= 0 (0 = <zero>)" when v is
// negative; zero says what the flag's 0 means.
func notNegative[T int | int64 | time.Duration](add func(error), flag string, v T, zero string) {
	if v < 0 {
		add(fmt.Errorf("--%s=%v: must be >= 0 (0 = %s)", flag, v, zero))
	}
}
