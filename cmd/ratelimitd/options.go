package main

import (
	"time"

	"github.com/ratelimitd/ratelimitd/internal/compat"
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
	RedisWindowKeys     bool          // redis.Options.WindowKeys
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

	// The durable store of `store: durable` limits (postgres.Options):
	// its postgres:// URL (empty: none), a file holding its password,
	// the bound of a decision and the pool's size.
	DurableURL          string        // --durable-url
	DurablePasswordFile string        // --durable-password-file
	DurableTimeout      time.Duration // --durable-timeout
	DurableMaxConns     int           // --durable-max-conns
	DurableConnect      time.Duration // --durable-connect-timeout
	DurableAsyncCommit  bool          // --durable-async-commit

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
	// drops an expired key, or, when none has expired, the new key is
	// decided by the store's sketch (never over-admitting) or denied.
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
	// LeaseInterval is the renewal interval of leased limits
	// (lease.Options.Interval).
	LeaseInterval time.Duration
	// RLQSInterval is the RLQS reporting round (rlqs.Options.Interval).
	RLQSInterval time.Duration
	// RLQSAbandonAfter is the silence after which an RLQS bucket is
	// abandoned (rlqs.Options.AbandonAfter).
	RLQSAbandonAfter time.Duration
	// RLQSHeadroom is the share of a limit the Envoys' full buckets hold
	// (rlqs.Options.Headroom).
	RLQSHeadroom float64
	// RLQSMaxBucketsPerStream bounds one RLQS stream's buckets
	// (rlqs.Options.MaxBucketsPerStream).
	RLQSMaxBucketsPerStream int
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
	// refEnv is the reading of the envoyproxy/ratelimit variables
	// (compat.ReadEnv), for resolveMode and the local cache default.
	refEnv compat.Env

	// fromEnv maps the name of each flag whose value came from its
	// RATELIMITD_* twin or from an envoyproxy/ratelimit variable of the
	// settings table (not overridden on the command line) to that
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
