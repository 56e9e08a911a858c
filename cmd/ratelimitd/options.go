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

	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// Options is everything `ratelimitd serve` reads from its command line and
// environment, validated. Each field has a flag (see registerServeFlags), an
// environment twin RATELIMITD_<FLAG_IN_UPPER_SNAKE>, and possibly an
// envoyproxy/ratelimit variable (see legacy.go). Precedence: flag >
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
	XDSNodeID               string
	XDSNodeMetadata         string
	XDSHeaders              string
	XDSConnectRetryInterval time.Duration
	XDSTLS                  bool
	XDSTLSCert              string
	XDSTLSKey               string
	XDSTLSCA                string
	XDSTLSSAN               string
	XDSBackoffInitial       time.Duration
	XDSBackoffMax           time.Duration
	XDSBackoffRandomFactor  float64
	XDSBackoffJitter        bool
	XDSMaxMsgSize           int

	GRPCAddr  string // host:port of the Envoy RLS v3 gRPC server
	HTTPAddr  string // host:port of /healthcheck, /json, /metrics
	DebugAddr string // host:port of /rlconfig, /debug/pprof/; "" disables
	// MetricsAddr, when set, also serves /metrics on its own listener
	// (envoyproxy/ratelimit PROMETHEUS_ADDR); "" = only on HTTPAddr.
	MetricsAddr string

	Backend      string // "memory", "redis" or "memcache" ("memcached" is read as "memcache")
	RedisURL     string // redis:// or rediss://, user:password@ for ACL
	RedisMode    string // "standalone", "cluster" or "sentinel"
	RedisAddrs   []string
	RedisMaster  string
	RedisTimeout time.Duration // Redis silence taken as a failure (redis.Options.Timeout)
	// RedisMaxWait and RedisDeadlineMargin are redis.Options.MaxWait and
	// DeadlineMargin: a call's budget without, and before, the caller's
	// deadline. RedisWarmup bounds the warm-up before health SERVING (0:
	// no warm-up).
	RedisMaxWait        time.Duration
	RedisDeadlineMargin time.Duration
	RedisWarmup         time.Duration
	RedisWaitReplicas   int // redis.Options.WaitReplicas
	RedisPoolSize       int // connections; 0 = the store's default
	LocalCacheSize      int // over-limit cache entries; 0 disables
	// Redis pool, batching and health tuning: redis.Options.DialTimeout,
	// MinIdleConns (capped at the pool size), Pipelines and
	// HealthInterval (0 disables the probe).
	RedisDialTimeout    time.Duration
	RedisMinIdleConns   int
	RedisPipelines      int
	RedisHealthInterval time.Duration
	// The Redis circuit breaker (redis.BreakerOptions). RedisBreaker false
	// disables it (every call goes to Redis); the other fields are then
	// not validated.
	RedisBreaker             bool
	RedisBreakerFailures     int
	RedisBreakerFailFor      time.Duration
	RedisBreakerWindow       time.Duration
	RedisBreakerMinCalls     int
	RedisBreakerFailureRatio float64
	RedisBreakerOpenFor      time.Duration
	RedisBreakerProbes       int
	// Redis TLS files (PEM) and options; rediss:// turns TLS on.
	RedisTLSCA         string
	RedisTLSCert       string
	RedisTLSKey        string
	RedisTLSSkipVerify bool
	// RedisSentinelAuth authenticates to the sentinels: "password" or
	// "user:password".
	RedisSentinelAuth string

	// The memcached backend (memcache.Options): servers as host:port
	// (MemcacheAddrs) or from an SRV record (MemcacheSRV, resolved again
	// every MemcacheSRVRefresh; 0: once), idle connections kept per
	// server, and the bound of each call.
	MemcacheAddrs        []string
	MemcacheSRV          string
	MemcacheSRVRefresh   time.Duration
	MemcacheMaxIdleConns int
	MemcacheTimeout      time.Duration

	ShadowMode bool
	QuotaMode  bool
	// Counting is the global counting policy (service.Options.Counting):
	// "all_or_nothing" (default) or "always_charge" (envoyproxy/ratelimit's
	// counting, the one to set for envoyproxy/ratelimit compatibility).
	Counting         string
	LogLevel         string // debug, info, warn, error
	LogFormat        string // text or json
	MergeDomains     bool
	IgnoreDotfiles   bool
	KeyPrefix        string
	KeyValues        string // "hash" or "clear" (development only)
	Headers          string // ietf, legacy, both or none
	NearLimitRatio   float64
	RetryJitter      time.Duration // maximum jitter added to Retry-After
	RequestOverrides bool
	DynamicMetadata  bool
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
	LogDecisionsRate float64

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
	MemoryLimitRatio float64

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
	GRPCTLSKey       string
	GRPCTLSClientCA  string
	GRPCTLSClientSAN string
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
	RedisSentinelAuthFile string

	// Resource bounds of the listeners (docs/security.md, "Resource
	// bounds"). GRPCMaxRecvMsgSize is the largest gRPC message received,
	// in bytes (a larger one fails with ResourceExhausted before it is
	// decoded); it also bounds the POST /json body (413 beyond it).
	// GRPCMaxConcurrentStreams is the streams one HTTP/2 connection may
	// have open at once (further calls wait for one to end).
	// GRPCMaxConnections is the gRPC connections open at once (0:
	// unbounded); beyond it new connections wait to be accepted.
	GRPCMaxRecvMsgSize       int
	GRPCMaxConcurrentStreams int
	GRPCMaxConnections       int
	// GRPCMaxConnectionAge is how long a gRPC client connection may live
	// before the server sends it GOAWAY (keepalive.ServerParameters
	// MaxConnectionAge; grpc-go adds ±10% jitter), so that Envoy's
	// long-lived HTTP/2 connections spread over replicas added later;
	// 0 = never. GRPCMaxConnectionAgeGrace is how long calls in flight on
	// such a connection may still run before it is closed
	// (MaxConnectionAgeGrace); 0 = no bound. envoyproxy/ratelimit
	// GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE.
	GRPCMaxConnectionAge      time.Duration
	GRPCMaxConnectionAgeGrace time.Duration
	// HTTP servers: HTTPReadTimeout bounds reading a whole request
	// (headers and body), HTTPWriteTimeout the time from the end of the
	// request headers to the end of the response (not on the debug
	// listener, whose profiles take longer), HTTPIdleTimeout how long a
	// keep-alive connection may wait for its next request. All > 0.
	HTTPReadTimeout  time.Duration
	HTTPWriteTimeout time.Duration
	HTTPIdleTimeout  time.Duration

	// OpenTelemetry tracing (off by default): OTLP/gRPC export to
	// TracingEndpoint (empty = OTEL_EXPORTER_OTLP_* environment, else
	// localhost:4317); W3C trace context from Envoy is continued.
	Tracing            bool
	TracingEndpoint    string
	TracingInsecure    bool
	TracingSampleRatio float64
	TracingServiceName string

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
	LegacyRemainingHeader string
	LegacyResetHeader     string
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
	StopIncrementWhenOverLimit bool

	// modeReason says why the mode in force was chosen (startup log).
	modeReason string
	// legacySeen records the envoyproxy/ratelimit variables found set.
	legacySeen legacySeen

	// fromEnv maps the name of each flag whose value came from its
	// RATELIMITD_* twin (not overridden on the command line) to that
	// variable, so that errors name where a bad value was set.
	fromEnv map[string]string
}

// defaultOptions are the contract's defaults.
func defaultOptions() Options {
	return Options{
		Config:       []string{"./config"},
		ConfigSource: "file",
		// pkg/policy/xds defaults (envoyproxy/ratelimit's), spelled out
		// so -h shows them.
		XDSServerURL:            xds.DefaultServerURL,
		XDSNodeID:               xds.DefaultNodeID,
		XDSConnectRetryInterval: xds.DefaultConnectRetryInterval,
		XDSBackoffInitial:       xds.DefaultBackoffInitial,
		XDSBackoffMax:           xds.DefaultBackoffMax,
		XDSBackoffRandomFactor:  xds.DefaultBackoffRandomFactor,
		XDSBackoffJitter:        true,
		GRPCAddr:                ":8081",
		HTTPAddr:                ":8080",
		DebugAddr:               "127.0.0.1:6070",
		Backend:                 "memory",
		RedisURL:                "redis://127.0.0.1:6379/0",
		RedisMode:               "standalone",
		RedisTimeout:            10 * time.Millisecond,
		LogLevel:                "info",
		LogFormat:               "text",
		KeyValues:               "hash",
		Headers:                 "ietf",
		Counting:                "all_or_nothing",
		Mode:                    modeAuto,
		ProblemBody:             true,
		// service package defaults, spelled out so -h shows them.
		LegacyLimitHeader:     service.HeaderLegacyLimit,
		LegacyRemainingHeader: service.HeaderLegacyRemaining,
		LegacyResetHeader:     service.HeaderLegacyReset,
		NearLimitRatio:        0.8,
		RetryJitter:           time.Second,
		RequestOverrides:      true,
		ShutdownGrace:         15 * time.Second,
		// service defaults, spelled out so -h shows them.
		ProblemTypeBase:      service.DefaultProblemTypeBase,
		DetailedMetricCap:    service.DefaultDetailedMetricCap,
		FailClosedRetryAfter: service.DefaultFailClosedRetryAfter,
		LogDecisions:         "off",
		LogDecisionsRate:     service.DefaultDecisionLogRate,
		// ≈ 111–128 bytes of heap per key for fixed/sliding window and
		// token bucket (docs/operations.md): about 110–130 MB at the bound.
		MemoryMaxKeys: 1_000_000,
		// ≈ 10.7 MB of live heap per 10,000 rules (docs/config.md): about
		// 54 MB at the bound, twice that while a reload swaps.
		MaxConfigRules: 50_000,
		// A load allocates ≈ 46 bytes per config byte (docs/config.md).
		MaxConfigBytes: 8 << 20,
		// Kubernetes ConfigMap mounts hold ..data and timestamped dot
		// directories; loading them would load every file twice.
		IgnoreDotfiles:     true,
		TracingSampleRatio: 1,
		TracingServiceName: "ratelimitd",

		// redis package defaults, spelled out so -h shows them.
		RedisMaxWait:             redis.DefaultMaxWait,
		RedisDeadlineMargin:      redis.DefaultDeadlineMargin,
		RedisPoolSize:            redis.DefaultPoolSize,
		RedisWarmup:              redis.DefaultWarmup,
		RedisDialTimeout:         redis.DefaultDialTimeout,
		RedisMinIdleConns:        redis.DefaultMinIdleConns,
		RedisPipelines:           redis.DefaultPipelines,
		RedisHealthInterval:      redis.DefaultHealthInterval,
		RedisBreaker:             true,
		RedisBreakerFailures:     redis.DefaultBreakerFailures,
		RedisBreakerFailFor:      redis.DefaultBreakerFailFor,
		RedisBreakerWindow:       redis.DefaultBreakerWindow,
		RedisBreakerMinCalls:     redis.DefaultBreakerMinCalls,
		RedisBreakerFailureRatio: redis.DefaultBreakerFailureRatio,
		RedisBreakerOpenFor:      redis.DefaultBreakerOpenFor,
		RedisBreakerProbes:       redis.DefaultBreakerProbes,

		MemcacheMaxIdleConns: memcache.DefaultMaxIdleConns,
		MemcacheTimeout:      memcache.DefaultTimeout,

		GCPercent:        defaultGCPercent,
		MemoryLimitRatio: defaultMemoryLimitRatio,

		GRPCMaxRecvMsgSize:        defaultGRPCMaxRecvMsgSize,
		GRPCMaxConcurrentStreams:  defaultGRPCMaxConcurrentStreams,
		GRPCMaxConnectionAge:      defaultGRPCMaxConnectionAge,
		GRPCMaxConnectionAgeGrace: defaultGRPCMaxConnectionAgeGrace,
		HTTPReadTimeout:           10 * time.Second,
		HTTPWriteTimeout:          10 * time.Second,
		HTTPIdleTimeout:           2 * time.Minute,

		StatsdFlushInterval: statsd.DefaultFlushInterval,
		// envoyproxy/ratelimit with no environment: USE_STATSD=true,
		// STATSD_HOST=localhost, STATSD_PORT=8125.
		StatsdReferenceAddr: "localhost:8125",
	}
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

// registerServeFlags binds every serve flag to a field of o; the field's
// current value is the flag's default.
func registerServeFlags(fs *flag.FlagSet, o *Options) []*listValue {
	config := &listValue{p: &o.Config}
	addrs := &listValue{p: &o.RedisAddrs}
	mcAddrs := &listValue{p: &o.MemcacheAddrs}
	fs.Var(config, "config", "YAML config file or directory (repeatable, or comma-separated); directories are watched")
	fs.StringVar(&o.ConfigSource, "config-source", o.ConfigSource, "where configs come from: file (--config) or xds (an xDS management server, --xds-*; docs/xds.md)")
	fs.StringVar(&o.XDSServerURL, "xds-server-url", o.XDSServerURL, "xDS management server, host:port (gRPC target)")
	fs.StringVar(&o.XDSNodeID, "xds-node-id", o.XDSNodeID, "xDS node id the server keys its snapshot by (Envoy Gateway: envoy-ratelimit)")
	fs.StringVar(&o.XDSNodeMetadata, "xds-node-metadata", o.XDSNodeMetadata, "xDS node metadata: key=value,key2=value2 (string values)")
	fs.StringVar(&o.XDSHeaders, "xds-headers", o.XDSHeaders, "gRPC metadata sent on the xDS stream: name:value,name2:value2 (values never logged)")
	fs.DurationVar(&o.XDSConnectRetryInterval, "xds-connect-retry-interval", o.XDSConnectRetryInterval, "wait between attempts to reach the xDS server while no stream gets going (±50% jitter)")
	fs.BoolVar(&o.XDSTLS, "xds-tls", o.XDSTLS, "TLS to the xDS server (system roots unless --xds-tls-ca)")
	fs.StringVar(&o.XDSTLSCert, "xds-tls-cert", o.XDSTLSCert, "client certificate (PEM) for mutual TLS to the xDS server; read again on every connection")
	fs.StringVar(&o.XDSTLSKey, "xds-tls-key", o.XDSTLSKey, "client private key (PEM) for --xds-tls-cert")
	fs.StringVar(&o.XDSTLSCA, "xds-tls-ca", o.XDSTLSCA, "CA bundle (PEM) trusted for the xDS server certificate (default: system roots)")
	fs.StringVar(&o.XDSTLSSAN, "xds-tls-san", o.XDSTLSSAN, "name the xDS server certificate must carry, also sent as SNI (default: the host of --xds-server-url)")
	fs.DurationVar(&o.XDSBackoffInitial, "xds-backoff-initial", o.XDSBackoffInitial, "wait before reconnecting after an xDS stream ends; doubles per further end without a good config")
	fs.DurationVar(&o.XDSBackoffMax, "xds-backoff-max", o.XDSBackoffMax, "longest wait before reconnecting to the xDS server")
	fs.Float64Var(&o.XDSBackoffRandomFactor, "xds-backoff-random-factor", o.XDSBackoffRandomFactor, "with --xds-backoff-jitter, each reconnect wait is spread over ±this share of itself, in [0, 1]")
	fs.BoolVar(&o.XDSBackoffJitter, "xds-backoff-jitter", o.XDSBackoffJitter, "randomize reconnect waits by --xds-backoff-random-factor")
	fs.IntVar(&o.XDSMaxMsgSize, "xds-max-msg-size", o.XDSMaxMsgSize, "largest xDS response accepted, in bytes (0: gRPC's default, 4 MiB)")
	fs.StringVar(&o.GRPCAddr, "grpc-addr", o.GRPCAddr, "Envoy RLS v3 gRPC listen address (+ gRPC health, reflection)")
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "HTTP listen address: /healthcheck, /json, /metrics")
	fs.StringVar(&o.DebugAddr, "debug-addr", o.DebugAddr, "debug listen address: /rlconfig, /debug/pprof/ (empty disables)")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "optional extra listen address serving only /metrics")
	fs.StringVar(&o.StatsdAddr, "statsd-addr", o.StatsdAddr, "also send envoyproxy/ratelimit's statsd stats over UDP to this host:port (empty: none)")
	fs.DurationVar(&o.StatsdFlushInterval, "statsd-flush-interval", o.StatsdFlushInterval, "how often statsd counters and gauges are sent (timer samples within a second)")
	fs.StringVar(&o.StatsdTags, "statsd-tags", o.StatsdTags, "tags appended to every statsd stat name as gostats does (.__key=value, sorted by key): key:value items separated by ',' (empty: none)")
	fs.StringVar(&o.Backend, "backend", o.Backend, "store: memory, redis or memcache (fixed windows only; also spelled memcached)")
	fs.StringVar(&o.RedisURL, "redis-url", o.RedisURL, "redis:// or rediss:// URL, with user:password@ for ACL and /db")
	fs.StringVar(&o.RedisMode, "redis-mode", o.RedisMode, "standalone, cluster (seeds in --redis-addrs) or sentinel (--redis-addrs sentinels + --redis-master)")
	fs.Var(addrs, "redis-addrs", "host:port list: cluster seed nodes or sentinels (repeatable, or comma-separated)")
	fs.StringVar(&o.RedisMaster, "redis-master", o.RedisMaster, "sentinel master name")
	fs.DurationVar(&o.RedisTimeout, "redis-timeout", o.RedisTimeout, "how long Redis may stay silent while a call awaits its reply before that counts as a backend failure (queue time inside ratelimitd never counts)")
	fs.DurationVar(&o.RedisMaxWait, "redis-max-wait", o.RedisMaxWait, "budget of a decision whose caller set no deadline (Envoy always sets one: its filter timeout)")
	fs.DurationVar(&o.RedisDeadlineMargin, "redis-deadline-margin", o.RedisDeadlineMargin, "kept before the caller's deadline: a decision is made by deadline - min(margin, a quarter of the time left)")
	fs.IntVar(&o.RedisWaitReplicas, "redis-wait-replicas", o.RedisWaitReplicas, "replicas that must acknowledge each decision's writes (WAIT) before it is used, so that no counted hit is lost in a failover; 0 waits for none (standalone and sentinel only)")
	fs.DurationVar(&o.RedisWarmup, "redis-warmup", o.RedisWarmup, "at startup, health stays NOT_SERVING until the Redis pools are dialed and the script is loaded, at most this long (0: no warm-up); Redis is never required to start")
	fs.IntVar(&o.RedisPoolSize, "redis-pool-size", o.RedisPoolSize, "Redis connections per node (0 = the store's default, 16)")
	fs.StringVar(&o.RedisTLSCA, "redis-tls-ca", o.RedisTLSCA, "PEM CA bundle trusted for Redis TLS (default: system roots)")
	fs.StringVar(&o.RedisTLSCert, "redis-tls-cert", o.RedisTLSCert, "PEM client certificate for Redis mutual TLS")
	fs.StringVar(&o.RedisTLSKey, "redis-tls-key", o.RedisTLSKey, "PEM client key for Redis mutual TLS")
	fs.BoolVar(&o.RedisTLSSkipVerify, "redis-tls-skip-verify", o.RedisTLSSkipVerify, "do not verify the Redis server certificate (insecure)")
	fs.StringVar(&o.RedisSentinelAuth, "redis-sentinel-auth", o.RedisSentinelAuth, "sentinel credentials: password or user:password")
	fs.DurationVar(&o.RedisDialTimeout, "redis-dial-timeout", o.RedisDialTimeout, "bound of background Redis dials (idle-pool refill, reconnect probe); a request's dial is bounded by its budget")
	fs.IntVar(&o.RedisMinIdleConns, "redis-min-idle-conns", o.RedisMinIdleConns, "Redis connections per node kept dialed ahead of traffic (at most the pool size)")
	fs.IntVar(&o.RedisPipelines, "redis-pipelines", o.RedisPipelines, "pipelines of batched Redis requests in flight at once, each on one pooled connection (at most the pool size)")
	fs.DurationVar(&o.RedisHealthInterval, "redis-health-interval", o.RedisHealthInterval, "period of the Redis health probe (PING when idle or the circuit is not closed); 0 disables it")
	fs.BoolVar(&o.RedisBreaker, "redis-breaker", o.RedisBreaker, "circuit breaker around Redis calls (false: every call goes to Redis)")
	fs.IntVar(&o.RedisBreakerFailures, "redis-breaker-failures", o.RedisBreakerFailures, "consecutive Redis failures that open the circuit")
	fs.DurationVar(&o.RedisBreakerFailFor, "redis-breaker-fail-for", o.RedisBreakerFailFor, "how long timeouts must have lasted before they open the circuit (raised to 2 x --redis-timeout)")
	fs.DurationVar(&o.RedisBreakerWindow, "redis-breaker-window", o.RedisBreakerWindow, "sliding window of the breaker's failure-ratio rule")
	fs.IntVar(&o.RedisBreakerMinCalls, "redis-breaker-min-calls", o.RedisBreakerMinCalls, "calls within --redis-breaker-window before the failure ratio applies")
	fs.Float64Var(&o.RedisBreakerFailureRatio, "redis-breaker-failure-ratio", o.RedisBreakerFailureRatio, "share of failed calls within --redis-breaker-window that opens the circuit, in (0, 1]")
	fs.DurationVar(&o.RedisBreakerOpenFor, "redis-breaker-open-for", o.RedisBreakerOpenFor, "how long the circuit stays open before half-open probes")
	fs.IntVar(&o.RedisBreakerProbes, "redis-breaker-probes", o.RedisBreakerProbes, "half-open probe calls in flight at once (0 means 1)")
	fs.Var(mcAddrs, "memcache-addrs", "memcached servers host:port (repeatable, or comma-separated); keys are spread over them")
	fs.StringVar(&o.MemcacheSRV, "memcache-srv", o.MemcacheSRV, "SRV record _service._proto.name listing the memcached servers (instead of --memcache-addrs)")
	fs.DurationVar(&o.MemcacheSRVRefresh, "memcache-srv-refresh", o.MemcacheSRVRefresh, "resolve --memcache-srv again at this interval (0: once)")
	fs.IntVar(&o.MemcacheMaxIdleConns, "memcache-max-idle-conns", o.MemcacheMaxIdleConns, "idle connections kept per memcached server")
	fs.DurationVar(&o.MemcacheTimeout, "memcache-timeout", o.MemcacheTimeout, "bound of each memcached call (socket and connect timeout, and a decision's budget when the caller's deadline is later)")
	fs.IntVar(&o.LocalCacheSize, "local-cache-size", o.LocalCacheSize, "entries in the local over-limit cache (0 disables)")
	fs.BoolVar(&o.ShadowMode, "shadow-mode", o.ShadowMode, "global shadow mode: evaluate and report, never deny")
	fs.BoolVar(&o.QuotaMode, "quota-mode", o.QuotaMode, "global quota mode: every descriptor is soft (denies only when all do)")
	fs.StringVar(&o.Counting, "counting", o.Counting, "counting policy of rules without counting: all_or_nothing (a denied request consumes nothing) or always_charge (every hit is charged, even over the limit)")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", o.LogFormat, "text or json")
	fs.BoolVar(&o.MergeDomains, "merge-domains", o.MergeDomains, "let several files contribute to one domain")
	fs.BoolVar(&o.IgnoreDotfiles, "ignore-dotfiles", o.IgnoreDotfiles, "skip config files and directories whose name starts with a dot")
	fs.StringVar(&o.KeyPrefix, "key-prefix", o.KeyPrefix, "prefix of every backend key")
	fs.StringVar(&o.KeyValues, "key-values", o.KeyValues, "descriptor values in backend keys: hash, or clear (development only)")
	fs.StringVar(&o.Headers, "headers", o.Headers, "response headers: ietf, legacy (X-RateLimit-*), both or none")
	fs.StringVar(&o.Mode, "mode", o.Mode, "auto (reference mode when envoyproxy/ratelimit's environment is in use and no --config), reference or native")
	fs.BoolVar(&o.ProblemBody, "problem-body", o.ProblemBody, "on OVER_LIMIT add Retry-After and an RFC 9457 problem body (default false in reference mode)")
	fs.StringVar(&o.LegacyLimitHeader, "legacy-limit-header", o.LegacyLimitHeader, "name of the legacy limit header (requests_per_unit); reference mode: RateLimit-Limit")
	fs.StringVar(&o.LegacyRemainingHeader, "legacy-remaining-header", o.LegacyRemainingHeader, "name of the legacy remaining header (limit_remaining); reference mode: RateLimit-Remaining")
	fs.StringVar(&o.LegacyResetHeader, "legacy-reset-header", o.LegacyResetHeader, "name of the legacy reset header (seconds until reset); reference mode: RateLimit-Reset")
	fs.Float64Var(&o.NearLimitRatio, "near-limit-ratio", o.NearLimitRatio, "fraction of a limit used above which a decision counts as near_limit")
	fs.DurationVar(&o.RetryJitter, "retry-jitter", o.RetryJitter, "maximum jitter added to Retry-After")
	fs.BoolVar(&o.RequestOverrides, "request-overrides", o.RequestOverrides, "honour per-descriptor limit overrides sent by Envoy")
	fs.BoolVar(&o.DynamicMetadata, "dynamic-metadata", o.DynamicMetadata, "fill RateLimitResponse.dynamic_metadata")
	fs.BoolVar(&o.NearLimitHeader, "near-limit-header", o.NearLimitHeader, "add Ratelimitd-Near-Limit listing the policies past --near-limit-ratio")
	fs.StringVar(&o.ProblemTypeBase, "problem-type-base", o.ProblemTypeBase, "prefix of the RFC 9457 problem type (quota-exceeded, temporary-reduced-capacity)")
	fs.StringVar(&o.ProblemDetail, "problem-detail", o.ProblemDetail, "problem detail template with {policy}, {quota}, {window}, {retry_after} (empty: built-in sentence)")
	fs.IntVar(&o.DetailedMetricCap, "detailed-metric-cap", o.DetailedMetricCap, "distinct rule label values from detailed_metric rules per loaded config, then \"_other\" (negative disables detailed labels)")
	fs.StringVar(&o.LogDecisions, "log-decisions", o.LogDecisions, "decision log: off, denied (requests with a denied descriptor) or all; one \"decision\" line each, values hashed unless --key-values=clear")
	fs.Float64Var(&o.LogDecisionsRate, "log-decisions-rate", o.LogDecisionsRate, "most decision log lines per second (token bucket); the rest are counted in ratelimitd_decision_log_suppressed_total")
	fs.DurationVar(&o.FailClosedRetryAfter, "fail-closed-retry-after", o.FailClosedRetryAfter, "Retry-After base when failure_mode: closed denies because the backend failed")
	fs.IntVar(&o.MemoryMaxKeys, "memory-max-keys", o.MemoryMaxKeys, "keys the in-memory store (and the failure_mode: local fallback) may hold; when full, new keys get the rule's failure mode (0 = unbounded)")
	fs.IntVar(&o.MaxConfigRules, "max-config-rules", o.MaxConfigRules, "most rules a loaded config may hold, at startup and at reload; a larger config is refused and the config in force stays (0 = no limit)")
	fs.Int64Var(&o.MaxConfigBytes, "max-config-bytes", o.MaxConfigBytes, "most bytes the config files may hold together, checked before parsing, at startup and at reload; a larger config is refused and the config in force stays (0 = no limit)")
	fs.IntVar(&o.GCPercent, "gc-percent", o.GCPercent, "Go GC target percent unless GOGC is set (-1 turns the GC off; needs a memory limit)")
	fs.Var(&o.MemoryLimit, "memory-limit", "Go soft memory limit in `bytes` (e.g. 400MiB) unless GOMEMLIMIT is set; 0: --memory-limit-ratio of the cgroup memory limit")
	fs.Float64Var(&o.MemoryLimitRatio, "memory-limit-ratio", o.MemoryLimitRatio, "Go soft memory limit as a share of the cgroup memory limit, without --memory-limit or GOMEMLIMIT (0: none)")
	fs.DurationVar(&o.Drain, "drain", o.Drain, "on SIGTERM, report NOT_SERVING this long before closing listeners")
	fs.DurationVar(&o.ShutdownGrace, "shutdown-grace", o.ShutdownGrace, "on SIGTERM, wait at most this long for in-flight calls")
	fs.StringVar(&o.GRPCTLSCert, "grpc-tls-cert", o.GRPCTLSCert, "gRPC server certificate chain (PEM); enables TLS, reloaded on change")
	fs.StringVar(&o.GRPCTLSKey, "grpc-tls-key", o.GRPCTLSKey, "gRPC server private key (PEM)")
	fs.StringVar(&o.GRPCTLSClientCA, "grpc-tls-client-ca", o.GRPCTLSClientCA, "CA bundle (PEM) for client certificates: enables mTLS")
	fs.StringVar(&o.GRPCTLSClientSAN, "grpc-tls-client-san", o.GRPCTLSClientSAN, "required SAN in client certificates (with --grpc-tls-client-ca)")
	fs.BoolVar(&o.HTTPTLS, "http-tls", o.HTTPTLS, "serve the HTTP listener with the gRPC TLS certificate; POST /json then needs a client certificate when gRPC does (without it, /json is off while gRPC uses TLS)")
	fs.StringVar(&o.DebugTokenFile, "debug-token-file", o.DebugTokenFile, "file holding a bearer token that admits non-loopback connections to the debug listener (empty: loopback connections only)")
	fs.StringVar(&o.RedisPasswordFile, "redis-password-file", o.RedisPasswordFile, "file holding the Redis password, read for every new connection (wins over the URL's password)")
	fs.StringVar(&o.RedisSentinelAuthFile, "redis-sentinel-auth-file", o.RedisSentinelAuthFile, "file holding the sentinel credentials (password or user:password), read at startup")
	fs.IntVar(&o.GRPCMaxRecvMsgSize, "grpc-max-recv-msg-size", o.GRPCMaxRecvMsgSize, "largest gRPC message received, in bytes (larger: ResourceExhausted, not decoded); also the POST /json body bound (larger: 413)")
	fs.IntVar(&o.GRPCMaxConcurrentStreams, "grpc-max-concurrent-streams", o.GRPCMaxConcurrentStreams, "gRPC calls one client connection may have in flight; further calls wait for one to end")
	fs.IntVar(&o.GRPCMaxConnections, "grpc-max-connections", o.GRPCMaxConnections, "gRPC client connections open at once; further ones wait to be accepted (0 = unbounded)")
	fs.DurationVar(&o.GRPCMaxConnectionAge, "grpc-max-connection-age", o.GRPCMaxConnectionAge, "after this long (±10% jitter) a gRPC client connection is sent GOAWAY, so Envoy reconnects and new replicas get traffic (0 = never)")
	fs.DurationVar(&o.GRPCMaxConnectionAgeGrace, "grpc-max-connection-age-grace", o.GRPCMaxConnectionAgeGrace, "after GOAWAY from --grpc-max-connection-age, calls in flight may run this long before the connection is closed (0 = no bound)")
	fs.DurationVar(&o.HTTPReadTimeout, "http-read-timeout", o.HTTPReadTimeout, "HTTP listeners: time to read a whole request (headers and body); a slower client is disconnected")
	fs.DurationVar(&o.HTTPWriteTimeout, "http-write-timeout", o.HTTPWriteTimeout, "HTTP listener (not debug): time from the end of the request headers to the end of the response")
	fs.DurationVar(&o.HTTPIdleTimeout, "http-idle-timeout", o.HTTPIdleTimeout, "HTTP listeners: how long a keep-alive connection may wait for its next request")
	fs.BoolVar(&o.Tracing, "tracing", o.Tracing, "export OpenTelemetry spans over OTLP/gRPC (continues Envoy's W3C trace context)")
	fs.StringVar(&o.TracingEndpoint, "tracing-endpoint", o.TracingEndpoint, "OTLP/gRPC collector host:port (empty: OTEL_EXPORTER_OTLP_* environment, else localhost:4317)")
	fs.BoolVar(&o.TracingInsecure, "tracing-insecure", o.TracingInsecure, "plaintext to the OTLP collector (node-local collector or mesh sidecar)")
	fs.Float64Var(&o.TracingSampleRatio, "tracing-sample-ratio", o.TracingSampleRatio, "fraction of root spans sampled; a sampled parent from Envoy is always followed")
	fs.StringVar(&o.TracingServiceName, "tracing-service-name", o.TracingServiceName, "service.name resource attribute of exported spans")
	return []*listValue{config, addrs, mcAddrs}
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
		// The reference's variables carry credentials (REDIS_AUTH,
		// REDIS_SENTINEL_AUTH, a REDIS_URL with user info): none is
		// quoted back.
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
		return o, warnings, scrubErr(err, secrets...)
	}
	fs := flag.NewFlagSet("ratelimitd serve", flag.ContinueOnError)
	// The flag package prints a parse error and the whole usage itself;
	// the caller prints the error once with a short hint instead, and the
	// usage goes out only for -h.
	fs.SetOutput(io.Discard)
	lists := registerServeFlags(fs, &o)
	durErr, restoreDurations := clearDurationErrors(fs)
	fs.Usage = func() {}
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
		return o, warnings, err
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
		return o, warnings, err
	}
	if fs.NArg() > 0 {
		return o, warnings, fmt.Errorf("serve takes no arguments, got %q (use --config)", fs.Args())
	}
	// Level names are case-insensitive (RATELIMITD_LOG_LEVEL=DEBUG), as
	// are the formats.
	o.LogLevel = strings.ToLower(strings.TrimSpace(o.LogLevel))
	if o.LogLevel == "warning" {
		o.LogLevel = "warn"
	}
	o.LogFormat = strings.ToLower(strings.TrimSpace(o.LogFormat))
	if o.Backend == "memcached" {
		o.Backend = "memcache"
	}
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

// Validate reports every invalid field at once.
func (o Options) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
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
	if o.Backend == "redis" {
		switch o.RedisMode {
		case "cluster":
			if len(o.RedisAddrs) == 0 {
				add(errors.New("--redis-mode=cluster needs --redis-addrs (seed nodes)"))
			}
		case "sentinel":
			if len(o.RedisAddrs) == 0 || o.RedisMaster == "" {
				add(errors.New("--redis-mode=sentinel needs --redis-addrs (sentinels) and --redis-master"))
			}
		}
	}
	if o.Backend == "memcache" {
		switch {
		case len(o.MemcacheAddrs) == 0 && o.MemcacheSRV == "":
			add(errors.New("--backend=memcache needs --memcache-addrs or --memcache-srv"))
		case len(o.MemcacheAddrs) > 0 && o.MemcacheSRV != "":
			add(errors.New("--memcache-addrs and --memcache-srv: set one, not both"))
		}
	}
	if o.MemcacheSRVRefresh < 0 {
		add(fmt.Errorf("--memcache-srv-refresh=%s: must be >= 0 (0: resolve once)", o.MemcacheSRVRefresh))
	}
	if o.MemcacheMaxIdleConns <= 0 {
		add(fmt.Errorf("--memcache-max-idle-conns=%d: must be > 0", o.MemcacheMaxIdleConns))
	}
	if o.MemcacheTimeout <= 0 {
		add(fmt.Errorf("--memcache-timeout=%s: must be > 0", o.MemcacheTimeout))
	}
	if o.RedisTimeout <= 0 {
		add(fmt.Errorf("--redis-timeout=%s: must be > 0", o.RedisTimeout))
	}
	if (o.RedisTLSCert == "") != (o.RedisTLSKey == "") {
		add(errors.New("--redis-tls-cert and --redis-tls-key go together"))
	}
	if o.RedisPoolSize < 0 {
		add(fmt.Errorf("--redis-pool-size=%d: must be >= 0", o.RedisPoolSize))
	}
	if o.LocalCacheSize < 0 {
		add(fmt.Errorf("--local-cache-size=%d: must be >= 0", o.LocalCacheSize))
	}
	add(o.validateRedisTuning())
	if o.GCPercent < -1 {
		add(fmt.Errorf("--gc-percent=%d: must be >= 0, or -1 (off, with a memory limit)", o.GCPercent))
	}
	if o.MemoryLimit < 0 {
		add(fmt.Errorf("--memory-limit=%d: must be >= 0", o.MemoryLimit))
	}
	if !(o.MemoryLimitRatio >= 0 && o.MemoryLimitRatio <= 1) {
		add(fmt.Errorf("--memory-limit-ratio=%v: must be in [0, 1] (0: no limit from the cgroup)", o.MemoryLimitRatio))
	}
	if !(o.NearLimitRatio > 0 && o.NearLimitRatio <= 1) {
		add(fmt.Errorf("--near-limit-ratio=%v: must be in (0, 1]", o.NearLimitRatio))
	}
	if o.RetryJitter < 0 {
		add(fmt.Errorf("--retry-jitter=%s: must be >= 0", o.RetryJitter))
	}
	if o.FailClosedRetryAfter <= 0 {
		add(fmt.Errorf("--fail-closed-retry-after=%s: must be > 0", o.FailClosedRetryAfter))
	}
	if o.DetailedMetricCap == 0 {
		add(errors.New("--detailed-metric-cap=0: want > 0, or negative to disable detailed labels"))
	}
	if o.MemoryMaxKeys < 0 {
		add(fmt.Errorf("--memory-max-keys=%d: must be >= 0 (0 = unbounded)", o.MemoryMaxKeys))
	}
	if o.MaxConfigRules < 0 {
		add(fmt.Errorf("--max-config-rules=%d: must be >= 0 (0 = no limit)", o.MaxConfigRules))
	}
	if o.MaxConfigBytes < 0 {
		add(fmt.Errorf("--max-config-bytes=%d: must be >= 0 (0 = no limit)", o.MaxConfigBytes))
	}
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
	if o.GRPCMaxConnections < 0 {
		add(fmt.Errorf("--grpc-max-connections=%d: must be >= 0 (0 = unbounded)", o.GRPCMaxConnections))
	}
	if o.GRPCMaxConnectionAge < 0 {
		add(fmt.Errorf("--grpc-max-connection-age=%s: must be >= 0 (0 = never)", o.GRPCMaxConnectionAge))
	}
	if o.GRPCMaxConnectionAgeGrace < 0 {
		add(fmt.Errorf("--grpc-max-connection-age-grace=%s: must be >= 0 (0 = no bound)", o.GRPCMaxConnectionAgeGrace))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"http-read-timeout", o.HTTPReadTimeout}, {"http-write-timeout", o.HTTPWriteTimeout}, {"http-idle-timeout", o.HTTPIdleTimeout}} {
		if d.v <= 0 {
			add(fmt.Errorf("--%s=%s: must be > 0", d.name, d.v))
		}
	}
	return errors.Join(errs...)
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
