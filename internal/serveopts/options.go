package serveopts

import (
	"time"

	"github.com/ratelimitd/ratelimitd/internal/compat"
	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/lease"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry"
)

// Options is everything `ratelimitd serve` reads from its command line and
// environment, validated. Each field with a flag is one entry of the
// settings table (settings.go: flag, environment twin
// RATELIMITD_<FLAG_IN_UPPER_SNAKE>, envoyproxy/ratelimit variables,
// default, doc line; docs/flags.md lists them). Precedence: flag >
// RATELIMITD_* > legacy variable > default.
type Options struct {
	// The package options a setting binds directly: the flag sets the
	// field, the package's Validate states its rules, and an error about
	// the field names the flag (validateOwners). redisOptions and
	// memcacheOptions add what the command derives (key prefix, pool
	// default, TLS on).
	Redis    redis.Options
	Memcache memcache.Options // the --memcache-* flags
	RLQS     rlqs.Options     // the --rlqs-* flags
	// The service.Options the answer flags set; ServiceOptions adds the
	// rest (parsed words, inverted switches, the detailed-metric cap's
	// sign).
	Service service.Options
	// The xds.Options the --xds-* flags set as they are; XDSOptions adds
	// the parsed, inverted and file-read ones (docs/xds.md).
	XDS xds.Options
	// The telemetry.Options the --tracing-* flags set;
	// TelemetryOptions maps the flag's sample ratio onto the package's.
	Telemetry telemetry.Options
	// The lease.Options --lease-interval sets; LeaseOptions adds the
	// store, registry and logger.
	Lease lease.Options

	Config       []string // YAML files or directories, read with ConfigSource "file"
	ConfigSource string   // "file" or "xds"

	// The xDS client's settings that are no xds.Options field as they
	// are (XDSOptions parses them, reads the files, inverts the switch).
	XDSNodeMetadata  string // --xds-node-metadata
	XDSHeaders       string // may hold credentials; never logged
	XDSTLS           bool   // --xds-tls
	XDSTLSCert       string // --xds-tls-cert
	XDSTLSKey        string // --xds-tls-key
	XDSTLSCA         string // --xds-tls-ca
	XDSTLSSAN        string // --xds-tls-san
	XDSBackoffJitter bool   // --xds-backoff-jitter

	// Listeners: gRPC (RLS), HTTP, debug ("" disables) and the extra
	// /metrics listener ("" = none).
	GRPCAddr, HTTPAddr, DebugAddr, MetricsAddr string // --grpc-addr, --http-addr, --debug-addr, --metrics-addr

	Backend string // "memory", "redis" or "memcache"
	// Redis settings that are no redis.Options field: the warm-up bound
	// and the sentinel credentials, given or read from a file.
	RedisWarmup           time.Duration // --redis-warmup
	RedisSentinelAuth     string        // "password" or "user:password"
	RedisSentinelAuthFile string        // --redis-sentinel-auth-file

	// The durable store of `store: durable` limits (postgres.Options).
	DurableURL          string        // --durable-url
	DurablePasswordFile string        // --durable-password-file
	DurableTimeout      time.Duration // --durable-timeout
	DurableMaxConns     int           // --durable-max-conns
	DurableConnect      time.Duration // --durable-connect-timeout
	DurableAsyncCommit  bool          // --durable-async-commit

	// Answers (service.Options).
	Counting         string        // "all_or_nothing" or "always_charge"
	Headers          string        // ietf, legacy, both or none
	RetryJitter      time.Duration // --retry-jitter
	RequestOverrides bool          // --request-overrides
	LogDecisions     string        // off, denied or all

	LogLevel, LogFormat string // --log-level, --log-format
	MergeDomains        bool   // --merge-domains
	IgnoreDotfiles      bool   // --ignore-dotfiles
	KeyPrefix           string // --key-prefix
	KeyValues           string // "hash" or "clear"
	MemoryMaxKeys       int    // 0 = unbounded
	MaxConfigRules      int    // 0 = no limit
	MaxConfigBytes      int64  // 0 = no limit

	// Go runtime: GC target and soft memory limit (0: from the cgroup
	// limit times MemoryLimitRatio).
	GCPercent        int               // --gc-percent
	MemoryLimit      gcpolicy.ByteSize // --memory-limit
	MemoryLimitRatio float64           // --memory-limit-ratio

	Drain, ShutdownGrace time.Duration // --drain, --shutdown-grace

	// gRPC server TLS ("" = plaintext); a client CA turns on mTLS.
	GRPCTLSCert, GRPCTLSKey, GRPCTLSClientCA, GRPCTLSClientSAN string // --grpc-tls-cert, --grpc-tls-key, --grpc-tls-client-ca, --grpc-tls-client-san
	HTTPTLS                                                    bool   // --http-tls
	DebugTokenFile                                             string // --debug-token-file

	// Resource bounds of the listeners (docs/security.md).
	GRPCMaxRecvMsgSize        int           // --grpc-max-recv-msg-size
	GRPCMaxConcurrentStreams  int           // --grpc-max-concurrent-streams
	GRPCMaxConnections        int           // --grpc-max-connections
	GRPCMaxConnectionAge      time.Duration // --grpc-max-connection-age
	GRPCMaxConnectionAgeGrace time.Duration // --grpc-max-connection-age-grace
	HTTPReadTimeout           time.Duration // --http-read-timeout
	HTTPWriteTimeout          time.Duration // --http-write-timeout
	HTTPIdleTimeout           time.Duration // --http-idle-timeout

	// statsd: envoyproxy/ratelimit's stats over UDP ("" = none).
	StatsdAddr          string        // --statsd-addr
	StatsdFlushInterval time.Duration // --statsd-flush-interval
	StatsdTags          string        // --statsd-tags
	// StatsdReferenceAddr is where envoyproxy/ratelimit would send statsd
	// with this environment (no flag; set by applyReferenceEnv, used only by
	// useReferenceStatsd).
	StatsdReferenceAddr string

	// Mode is --mode; Reference is the mode in force after resolveMode.
	Mode      string // --mode
	Reference bool   // the mode in force (resolveMode)
	// ProblemBody is service.Options.OmitProblem inverted.
	ProblemBody bool // --problem-body
	// Legacy header names (service.LegacyHeaderNames).
	LegacyLimitHeader, LegacyRemainingHeader, LegacyResetHeader string // --legacy-limit-header, --legacy-remaining-header, --legacy-reset-header
	// Set in reference mode (resolveMode): the reference's
	// answers and counting; StopIncrementWhenOverLimit is
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (no flag).
	ReferenceAnswers           bool
	ReferenceCounting          bool // reference mode's counting
	StopIncrementWhenOverLimit bool // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (no flag)

	modeReason string // why the mode in force was chosen (startup log)
	// refEnv is the reading of the envoyproxy/ratelimit variables
	// (compat.ReadEnv), for resolveMode and the local cache default.
	refEnv compat.Env
	// fromEnv maps each flag whose value came from its RATELIMITD_* twin
	// or an envoyproxy/ratelimit variable to that variable, so that
	// errors name where a bad value was set.
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
// 1 MiB: room for 16 copies of every header Envoy accepts by default
// (max_request_headers_kb: 60 KiB). The request's shape bounds allow far
// more, so this is what bounds a message, before any of it is decoded.
const defaultGRPCMaxRecvMsgSize = 1 << 20

// defaultGRPCMaxConcurrentStreams is the default
// --grpc-max-concurrent-streams: calls one HTTP/2 connection may have in
// flight. An Envoy worker thread keeps one connection per cluster host
// and its calls last a few milliseconds; at 1000 in flight per
// connection it would make ~100,000 decisions per second at 10 ms each.
const defaultGRPCMaxConcurrentStreams = 1000

// defaultGRPCMaxConnectionAge is the default --grpc-max-connection-age:
// after it each connection is sent GOAWAY and Envoy opens a new one,
// balanced over the current endpoints, so that replicas an autoscaler
// adds get traffic within minutes (envoyproxy/ratelimit: 24h).
const defaultGRPCMaxConnectionAge = 5 * time.Minute

// defaultGRPCMaxConnectionAgeGrace is the default
// --grpc-max-connection-age-grace: calls in flight when GOAWAY is sent
// may run this long before the connection is closed. A ShouldRateLimit
// call lasts milliseconds (Envoy's filter timeout is 20 ms by default);
// 30 s also lets a health Watch stream or reflection session end on its
// own terms in most cases (envoyproxy/ratelimit: 1h).
const defaultGRPCMaxConnectionAgeGrace = 30 * time.Second
