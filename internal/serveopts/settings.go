package serveopts

//go:generate go test -run TestFlagDocs -update .

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/compat"
	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/lease"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// setting is one `ratelimitd serve` setting: its flag, whose environment
// twin is envName(name), the envoyproxy/ratelimit variables that map onto
// it, its default and its doc line. settings is the one table the flag
// registration (registerServeFlags), the twins, the plain legacy mapping
// (legacyTable), Defaults, `serve -h`, the README's flag table
// and docs/flags.md are made from (flagdocs_test.go renders the last two and checks them).
type setting struct {
	name  string // flag name without dashes: "redis-url"
	group string // section of docs/flags.md: one of the group* constants
	// legacy are envoyproxy/ratelimit variables that set this field as
	// they are (same parse, no other effect); legacyTable lists them.
	legacy []string
	// legacyVia names the envoyproxy/ratelimit variables that reach this
	// field through internal/compat's own rules (documentation only).
	legacyVia string
	field     fieldRef
	// doc is the setting's documentation (Markdown), as docs/flags.md
	// prints it; sum, when doc is longer than a line, is the one line
	// -h and the README print (-h without the Markdown, helpText).
	doc, sum string
	// shown is the README's default column when it is not the default
	// value itself (e.g. "system roots"); "" prints the value.
	shown string
	// joins names the flag whose README row this flag shares (its name
	// and default are appended to that row); "" is a row of its own.
	joins string
	// backend, when set, is the only --backend the setting matters to:
	// its owner's errors are dropped under another backend.
	backend string
	// arg, when set, is the name -h gives the flag's value ("bytes"),
	// a word of doc; "" leaves the flag package's ("value", "int", ...).
	arg string
	// secret says what of the value is a credential, redacted wherever
	// ratelimitd prints the value (/debug/pprof/cmdline, logs, errors;
	// see secrets.go): declaring it is all a new credential flag needs.
	secret secrets.Kind
}

// Groups of settings (the sections of docs/flags.md).
const (
	groupConfig    = "Configuration source"
	groupListeners = "Listeners and TLS"
	groupBackend   = "Backend store"
	groupAnswers   = "Decisions and answers"
	groupTelemetry = "Logs, metrics and tracing"
	groupRuntime   = "Go runtime"
)

// groupOrder is the order of the sections of docs/flags.md.
var groupOrder = []string{groupConfig, groupListeners, groupBackend, groupAnswers, groupTelemetry, groupRuntime}

// fieldRef is the Options field a setting binds and its default. A field
// within a package's options (o.Redis.Timeout) names the setting's owner
// (ownersOf); also is another package option field the value feeds.
type fieldRef struct {
	ptr        func(o *Options) any // *string, *bool, *int, *int64, *float64, *time.Duration, *[]string or *gcpolicy.ByteSize
	setDefault func(o *Options)
	also       func(o *Options) any
}

// fieldOf binds the field p returns, with default def.
func fieldOf[T any](p func(o *Options) *T, def T) fieldRef {
	return fieldRef{
		ptr: func(o *Options) any { return p(o) },
		setDefault: func(o *Options) {
			v := def
			if l, ok := any(v).([]string); ok {
				// A copy: the table's slice stays unshared.
				*any(p(o)).(*[]string) = append([]string(nil), l...)
				return
			}
			*p(o) = v
		},
	}
}

// notOf binds the bool flag whose value is the field p returns inverted
// (--redis-breaker sets Breaker.Disabled), with default true.
func notOf(p func(o *Options) *bool) fieldRef {
	return fieldRef{
		ptr:        func(o *Options) any { return &notBool{p(o)} },
		setDefault: func(o *Options) { *p(o) = false },
	}
}

// errParse is the flag package's error for a malformed bool.
var errParse = errors.New("parse error")

// notBool is a bool flag.Value that stores its value inverted.
type notBool struct{ p *bool }

func (b *notBool) IsBoolFlag() bool { return true }

func (b *notBool) String() string {
	if b == nil || b.p == nil {
		return "false" // the zero value, for the flag package's defaults
	}
	return strconv.FormatBool(!*b.p)
}

func (b *notBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errParse // as the flag package reports a bad bool
	}
	*b.p = !v
	return nil
}

// feeds records p as another package option field the setting's value
// feeds (memcacheOptions copies it there), so errors about it name the flag too.
func (f fieldRef) feeds(p func(o *Options) any) fieldRef {
	f.also = p
	return f
}

// settings is the table of every serve setting, in the README's order.
var settings = []setting{
	{name: "config", group: groupConfig, legacyVia: "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY", field: fieldOf(func(o *Options) *[]string { return &o.Config }, []string{"./config"}), sum: "YAML file or directory (repeatable, or comma-separated); directories are reloaded", doc: "YAML file or directory (repeatable, or comma-separated); directories are watched and reloaded; not read with `--config-source=xds`"},
	{name: "config-source", group: groupConfig, legacyVia: "CONFIG_TYPE", field: fieldOf(func(o *Options) *string { return &o.ConfigSource }, "file"), sum: "where configs come from: `file` (`--config`) or `xds` ([docs/xds.md](docs/xds.md))", doc: "where configs come from: `file` (`--config`) or `xds`, an xDS management server such as Envoy Gateway's (envoyproxy/ratelimit `CONFIG_TYPE=GRPC_XDS_SOTW`; [docs/xds.md](docs/xds.md))"},
	{name: "xds-server-url", group: groupConfig, legacy: []string{"CONFIG_GRPC_XDS_SERVER_URL"}, field: fieldOf(func(o *Options) *string { return &o.XDS.ServerURL }, xds.DefaultServerURL), doc: "xDS management server, `host:port`", secret: secrets.Address},
	{name: "xds-node-id", group: groupConfig, legacy: []string{"CONFIG_GRPC_XDS_NODE_ID"}, field: fieldOf(func(o *Options) *string { return &o.XDS.NodeID }, xds.DefaultNodeID), doc: "node id the server keys its snapshot by (Envoy Gateway: `envoy-ratelimit`)"},
	{name: "xds-node-metadata", group: groupConfig, legacy: []string{"CONFIG_GRPC_XDS_NODE_METADATA"}, field: fieldOf(func(o *Options) *string { return &o.XDSNodeMetadata }, ""), doc: "node metadata, `key=value,key2=value2`"},
	{name: "xds-headers", group: groupConfig, legacy: []string{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"}, field: fieldOf(func(o *Options) *string { return &o.XDSHeaders }, ""), doc: "gRPC metadata on the xDS stream, `name:value,name2:value2` (values never logged)", secret: secrets.Headers},
	{name: "xds-connect-retry-interval", group: groupConfig, legacy: []string{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"}, field: fieldOf(func(o *Options) *time.Duration { return &o.XDS.ConnectRetryInterval }, xds.DefaultConnectRetryInterval), doc: "wait between attempts while the server cannot be reached (±50%)"},
	{name: "xds-tls", group: groupConfig, legacy: []string{"CONFIG_GRPC_XDS_SERVER_USE_TLS"}, field: fieldOf(func(o *Options) *bool { return &o.XDSTLS }, false), doc: "TLS to the xDS server"},
	{name: "xds-tls-cert", group: groupConfig, legacyVia: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", field: fieldOf(func(o *Options) *string { return &o.XDSTLSCert }, ""), doc: "PEM client certificate and key (mutual TLS); read again on every connection", shown: "(none)"},
	{name: "xds-tls-key", group: groupConfig, legacyVia: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", field: fieldOf(func(o *Options) *string { return &o.XDSTLSKey }, ""), doc: "client private key (PEM) for --xds-tls-cert", joins: "xds-tls-cert"},
	{name: "xds-tls-ca", group: groupConfig, legacyVia: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", field: fieldOf(func(o *Options) *string { return &o.XDSTLSCA }, ""), doc: "PEM CA bundle trusted for the server certificate", shown: "system roots"},
	{name: "xds-tls-san", group: groupConfig, legacyVia: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", field: fieldOf(func(o *Options) *string { return &o.XDSTLSSAN }, ""), doc: "name the server certificate must carry (also the SNI)", shown: "host of `--xds-server-url`"},
	{name: "xds-backoff-initial", group: groupConfig, legacy: []string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"}, field: fieldOf(func(o *Options) *time.Duration { return &o.XDS.BackoffInitial }, xds.DefaultBackoffInitial), sum: "wait before reconnecting after an xDS stream ends, doubled up to the max", doc: "wait before reconnecting after a stream ends: initial, doubled per further end without a good config, at most max"},
	{name: "xds-backoff-max", group: groupConfig, legacy: []string{"XDS_CLIENT_BACKOFF_MAX_INTERVAL"}, field: fieldOf(func(o *Options) *time.Duration { return &o.XDS.BackoffMax }, xds.DefaultBackoffMax), doc: "longest wait before reconnecting to the xDS server", joins: "xds-backoff-initial"},
	{name: "xds-backoff-random-factor", group: groupConfig, legacy: []string{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR"}, field: fieldOf(func(o *Options) *float64 { return &o.XDS.BackoffRandomFactor }, xds.DefaultBackoffRandomFactor), doc: "with jitter, each reconnect wait is spread over ± this share of itself"},
	{name: "xds-backoff-jitter", group: groupConfig, legacy: []string{"XDS_CLIENT_BACKOFF_JITTER"}, field: fieldOf(func(o *Options) *bool { return &o.XDSBackoffJitter }, true), doc: "randomize reconnect waits by --xds-backoff-random-factor", joins: "xds-backoff-random-factor"},
	{name: "xds-max-msg-size", group: groupConfig, legacy: []string{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"}, field: fieldOf(func(o *Options) *int { return &o.XDS.MaxRecvMsgSize }, 0), doc: "largest xDS response accepted, in bytes (`0`: gRPC's 4 MiB)"},
	{name: "grpc-addr", group: groupListeners, legacyVia: "GRPC_HOST, GRPC_PORT", field: fieldOf(func(o *Options) *string { return &o.GRPCAddr }, ":8081"), doc: "Envoy RLS v3 gRPC, plus `grpc.health.v1` and server reflection"},
	{name: "http-addr", group: groupListeners, legacyVia: "HOST, PORT", field: fieldOf(func(o *Options) *string { return &o.HTTPAddr }, ":8080"), doc: "`GET /healthcheck` (ready), `GET /livez` (the process answers), `POST /json`, `GET /metrics`"},
	{name: "debug-addr", group: groupListeners, legacyVia: "DEBUG_HOST, DEBUG_PORT", field: fieldOf(func(o *Options) *string { return &o.DebugAddr }, "127.0.0.1:6070"), sum: "`/rlconfig`, `/debug/pprof/` and the admin API; loopback-only without a token (empty disables)", doc: "`GET /rlconfig`, `/debug/pprof/`, the admin API (`POST /admin/explain`, `POST /admin/reset`, gRPC `ratelimitd.admin.v1.Admin`; [docs/admin.md](docs/admin.md)) (empty disables); bound beyond loopback it still serves only connections loopback at both ends unless `--debug-token-file` is set ([docs/security.md](docs/security.md#trust-boundaries))"},
	{name: "debug-token-file", group: groupListeners, field: fieldOf(func(o *Options) *string { return &o.DebugTokenFile }, ""), sum: "file with a bearer token that admits non-loopback debug connections", doc: "file holding a bearer token (`Authorization: Bearer …`) that admits non-loopback connections to the debug listener; re-read on every such request"},
	{name: "log-decisions", group: groupTelemetry, field: fieldOf(func(o *Options) *string { return &o.LogDecisions }, "off"), sum: "decision log: `off`, `denied` or `all` ([docs/admin.md](docs/admin.md#decision-log))", doc: "decision log: `denied` (requests with a denied descriptor) or `all`, one `decision` line each with domain, rules, codes, remaining and backend keys (values hashed unless `--key-values=clear`) ([docs/admin.md](docs/admin.md#decision-log))"},
	{name: "log-decisions-rate", group: groupTelemetry, field: fieldOf(func(o *Options) *float64 { return &o.Service.DecisionLogRate }, service.DefaultDecisionLogRate), sum: "most decision log lines per second; the rest are counted", doc: "most decision log lines per second (token bucket); the rest are counted in `ratelimitd_decision_log_suppressed_total` and in the next line's `suppressed`"},
	{name: "metrics-addr", group: groupListeners, legacyVia: "USE_PROMETHEUS, PROMETHEUS_ADDR", field: fieldOf(func(o *Options) *string { return &o.MetricsAddr }, ""), doc: "an extra listener serving only `/metrics`"},
	{name: "statsd-addr", group: groupTelemetry, legacyVia: "USE_STATSD, STATSD_HOST, STATSD_PORT", field: fieldOf(func(o *Options) *string { return &o.StatsdAddr }, ""), sum: "also send envoyproxy/ratelimit's statsd stats over UDP to this `host:port`", doc: "also send envoyproxy/ratelimit's statsd stats (its names) over UDP to this `host:port`; `USE_STATSD=true` sets it from `STATSD_HOST`/`STATSD_PORT` ([docs/metrics.md](docs/metrics.md#statsd-reference-names))", secret: secrets.Address},
	{name: "statsd-flush-interval", group: groupTelemetry, legacyVia: "STATS_FLUSH_INTERVAL", field: fieldOf(func(o *Options) *time.Duration { return &o.StatsdFlushInterval }, statsd.DefaultFlushInterval), sum: "how often statsd counters and gauges are sent", doc: "how often statsd counters and gauges are sent (`STATS_FLUSH_INTERVAL`); timer samples go within a second"},
	{name: "statsd-tags", group: groupTelemetry, legacyVia: "EXTRA_TAGS", field: fieldOf(func(o *Options) *string { return &o.StatsdTags }, ""), sum: "`key:value,...` tags appended to every statsd name, as gostats does", doc: "tags appended to every statsd name as gostats does (`EXTRA_TAGS`): `key:value` items separated by `,`, sent as `.__key=value` sorted by key ([metrics](docs/metrics.md))", shown: "—"},
	{name: "backend", group: groupBackend, legacyVia: "BACKEND_TYPE", field: fieldOf(func(o *Options) *string { return &o.Backend }, "memory"), sum: "`memory`, `redis` or `memcache`", doc: "`memory`, `redis` or `memcache` (also spelled `memcached`; fixed windows only, see [docs/memcached.md](docs/memcached.md)); `--redis-url`, `--redis-mode`, `--redis-addrs`, `--redis-master`, `--redis-password-file`, `--memcache-addrs` or `--memcache-srv` without `--backend` is a startup error, since every replica would count alone in memory"},
	{name: "redis-url", group: groupBackend, legacyVia: "REDIS_URL, REDIS_TYPE, REDIS_AUTH, REDIS_TLS, REDIS_SOCKET_TYPE", field: fieldOf(func(o *Options) *string { return &o.Redis.URL }, "redis://127.0.0.1:6379/0"), doc: "`redis://` or `rediss://` (TLS), `user:password@` for ACL", backend: "redis", secret: secrets.RedisURL},
	{name: "redis-mode", group: groupBackend, legacyVia: "REDIS_TYPE", field: fieldOf(func(o *Options) *string { return (*string)(&o.Redis.Mode) }, "standalone"), sum: "`standalone`, `cluster` or `sentinel` (`--redis-addrs`, `--redis-master`)", doc: "`standalone`, `cluster` (seed nodes in `--redis-addrs`), `sentinel` (`--redis-addrs` + `--redis-master`)", backend: "redis"},
	{name: "redis-addrs", group: groupBackend, legacyVia: "REDIS_URL", field: fieldOf(func(o *Options) *[]string { return &o.Redis.Addrs }, nil), doc: "cluster seed nodes or sentinels, `host:port`", backend: "redis", secret: secrets.Address},
	{name: "redis-master", group: groupBackend, legacyVia: "REDIS_URL", field: fieldOf(func(o *Options) *string { return &o.Redis.MasterName }, ""), doc: "Sentinel master name", backend: "redis"},
	{name: "redis-timeout", group: groupBackend, legacy: []string{"REDIS_TIMEOUT"}, field: fieldOf(func(o *Options) *time.Duration { return &o.Redis.Timeout }, 10*time.Millisecond), sum: "Redis silence on a call that counts as a backend failure; keep it under Envoy's 20 ms", doc: "how long Redis may stay silent while a call awaits its reply before that counts as a backend failure (breaker evidence; the rules' failure modes answer when the call's budget then runs out); time queued inside ratelimitd never counts; keep it well under Envoy's 20 ms filter timeout"},
	{name: "redis-max-wait", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.Redis.MaxWait }, redis.DefaultMaxWait), sum: "budget of a decision whose caller set no deadline", doc: "budget of a decision whose caller set no deadline (Envoy always sets one); see [docs/redis-operations.md](docs/redis-operations.md#budgets-and-timeouts)"},
	{name: "redis-deadline-margin", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.Redis.DeadlineMargin }, redis.DefaultDeadlineMargin), sum: "time kept before the caller's deadline (at most a quarter of the time left)", doc: "kept before the caller's deadline: a decision is made by deadline − min(margin, a quarter of the time left)"},
	{name: "redis-window-keys", group: groupBackend, field: fieldOf(func(o *Options) *bool { return &o.Redis.WindowKeys }, true), sum: "one key per window and an integer TAT; `false` keeps the older key layout", doc: "count epoch-aligned `fixed_window` and `sliding_window` limits under one key per window and `token_bucket` limits as an integer TAT (`INCRBY` or `SET`, no read before a fixed-window write; on by default): `false` keeps the layout of releases before window keys, whose counters the other layout does not see; switch as [docs/redis.md](docs/redis.md#window-keys) says"},
	{name: "redis-wait-replicas", group: groupBackend, field: fieldOf(func(o *Options) *int { return &o.Redis.WaitReplicas }, 0), sum: "replicas that must acknowledge each decision's writes (`WAIT`); 0: none", doc: "replicas that must acknowledge each decision's writes (`WAIT`) before it is used: no counted hit is lost in a Sentinel failover ([docs/redis-operations.md](docs/redis-operations.md#failover)); `0` waits for none"},
	{name: "redis-warmup", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.RedisWarmup }, redis.DefaultWarmup), sum: "at startup, stay NOT_SERVING at most this long while the pools dial; 0 skips it", doc: "at startup, health stays NOT_SERVING until the pools are dialed (every Cluster master) and the script is loaded, at most this long; `0` skips it; Redis is never required to start"},
	{name: "redis-pool-size", group: groupBackend, legacy: []string{"REDIS_POOL_SIZE"}, field: fieldOf(func(o *Options) *int { return &o.Redis.PoolSize }, redis.DefaultPoolSize), doc: "connections per node (0 = the store's default, 16)"},
	{name: "redis-tls-ca", group: groupBackend, legacy: []string{"REDIS_TLS_CACERT"}, field: fieldOf(func(o *Options) *string { return &o.Redis.TLSCAFile }, ""), doc: "PEM CA bundle trusted for Redis TLS", shown: "system roots", backend: "redis"},
	{name: "redis-tls-cert", group: groupBackend, legacy: []string{"REDIS_TLS_CLIENT_CERT"}, field: fieldOf(func(o *Options) *string { return &o.Redis.TLSCertFile }, ""), doc: "PEM client certificate and key for Redis mutual TLS", shown: "(none)"},
	{name: "redis-tls-key", group: groupBackend, legacy: []string{"REDIS_TLS_CLIENT_KEY"}, field: fieldOf(func(o *Options) *string { return &o.Redis.TLSKeyFile }, ""), doc: "PEM client key for Redis mutual TLS", joins: "redis-tls-cert"},
	{name: "redis-tls-skip-hostname", group: groupBackend, legacy: []string{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"}, field: fieldOf(func(o *Options) *bool { return &o.Redis.TLSSkipHostname }, false), doc: "accept a Redis certificate not naming the host dialed; its chain is still verified"},
	{name: "redis-tls-skip-verify", group: groupBackend, field: fieldOf(func(o *Options) *bool { return &o.Redis.TLSSkipVerify }, false), doc: "do not verify the Redis server certificate at all (insecure)"},
	{name: "redis-sentinel-auth", group: groupBackend, legacy: []string{"REDIS_SENTINEL_AUTH"}, field: fieldOf(func(o *Options) *string { return &o.RedisSentinelAuth }, ""), sum: "sentinel credentials, `password` or `user:password` (prefer the file)", doc: "sentinel credentials, `password` or `user:password` (visible in the process's command line: prefer the file or the environment twin)", secret: secrets.Whole},
	{name: "redis-password-file", group: groupBackend, field: fieldOf(func(o *Options) *string { return &o.Redis.PasswordFile }, ""), sum: "file holding the Redis password, read for every new connection", doc: "file holding the Redis password (a mounted Secret key; one trailing newline ignored), read for every new connection so a rotated password takes effect without a restart; wins over the URL's password"},
	{name: "redis-sentinel-auth-file", group: groupBackend, field: fieldOf(func(o *Options) *string { return &o.RedisSentinelAuthFile }, ""), doc: "file holding the sentinel credentials, read at startup"},
	{name: "redis-dial-timeout", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.Redis.DialTimeout }, redis.DefaultDialTimeout), sum: "bound of the health probe's warm-ups (dials, TLS handshakes, script load)", doc: "bound of the health probe's warm-ups (dials, TLS handshakes, script load); a request waits for its own dial within its budget, and a dial takes up to --redis-max-wait"},
	{name: "redis-min-idle-conns", group: groupBackend, field: fieldOf(func(o *Options) *int { return &o.Redis.MinIdleConns }, redis.DefaultMinIdleConns), doc: "connections per node kept dialed ahead of traffic (at most the pool size)"},
	{name: "redis-pipelines", group: groupBackend, field: fieldOf(func(o *Options) *int { return &o.Redis.Pipelines }, redis.DefaultPipelines), sum: "batches in flight at once, per master (0: the store's default)", doc: "batches in flight at once (per master on Cluster), each one script call on one pooled connection (at most the pool size; 0 = store default)"},
	{name: "redis-health-interval", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.Redis.HealthInterval }, redis.DefaultHealthInterval), sum: "period of the background health probe; `0s` disables it", doc: "period of the background health probe (`PING` when idle or the circuit is not closed); `0s` disables it"},
	{name: "redis-breaker", group: groupBackend, field: notOf(func(o *Options) *bool { return &o.Redis.Breaker.Disabled }), sum: "circuit breaker around Redis calls; `false` sends every call to Redis", doc: "circuit breaker around Redis calls; `false` sends every call to Redis ([docs/redis-operations.md](docs/redis-operations.md#circuit-breaker))"},
	{name: "redis-breaker-failures", group: groupBackend, field: fieldOf(func(o *Options) *int { return &o.Redis.Breaker.Failures }, redis.DefaultBreakerFailures), doc: "consecutive failures that open the circuit"},
	{name: "redis-breaker-fail-for", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.Redis.Breaker.FailFor }, redis.DefaultBreakerFailFor), sum: "how long a stall must last before it opens the circuit", doc: "how long a stall must have lasted before it opens the circuit (raised to 2 × `--redis-timeout`); the stall is then established and gets the rules' failure modes (cause `stalled`)"},
	{name: "redis-breaker-window", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.Redis.Breaker.Window }, redis.DefaultBreakerWindow), sum: "the ratio rule: calls within this window whose failed share opens the circuit", doc: "the ratio rule: at least `min-calls` calls within `window`, of which this share failed, open the circuit"},
	{name: "redis-breaker-min-calls", group: groupBackend, field: fieldOf(func(o *Options) *int { return &o.Redis.Breaker.MinCalls }, redis.DefaultBreakerMinCalls), doc: "calls within --redis-breaker-window before the failure ratio applies", joins: "redis-breaker-window"},
	{name: "redis-breaker-failure-ratio", group: groupBackend, field: fieldOf(func(o *Options) *float64 { return &o.Redis.Breaker.FailureRatio }, redis.DefaultBreakerFailureRatio), doc: "share of failed calls within --redis-breaker-window that opens the circuit, in (0, 1]", joins: "redis-breaker-window"},
	{name: "redis-breaker-open-for", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.Redis.Breaker.OpenFor }, redis.DefaultBreakerOpenFor), doc: "how long the circuit stays open before half-open probes"},
	{name: "redis-breaker-probes", group: groupBackend, field: fieldOf(func(o *Options) *int { return &o.Redis.Breaker.Probes }, redis.DefaultBreakerProbes), doc: "half-open probe calls in flight at once"},
	{name: "memcache-addrs", group: groupBackend, legacy: []string{"MEMCACHE_HOST_PORT"}, field: fieldOf(func(o *Options) *[]string { return &o.Memcache.Addrs }, nil), doc: "memcached servers, `host:port` (repeatable, or comma-separated); keys are spread over them", backend: "memcache", secret: secrets.Address},
	{name: "memcache-srv", group: groupBackend, legacy: []string{"MEMCACHE_SRV"}, field: fieldOf(func(o *Options) *string { return &o.Memcache.SRV }, ""), sum: "SRV record `_service._proto.name` naming the memcached servers", doc: "SRV record `_service._proto.name` whose targets are the memcached servers (instead of `--memcache-addrs`)", backend: "memcache", secret: secrets.Address},
	{name: "memcache-srv-refresh", group: groupBackend, legacy: []string{"MEMCACHE_SRV_REFRESH"}, field: fieldOf(func(o *Options) *time.Duration { return &o.Memcache.SRVRefresh }, 0), sum: "resolve `--memcache-srv` again at this interval; `0s` resolves once", doc: "resolve `--memcache-srv` again at this interval; `0s` resolves once (retried every 100 ms until it succeeds)"},
	{name: "memcache-max-idle-conns", group: groupBackend, legacy: []string{"MEMCACHE_MAX_IDLE_CONNS"}, field: fieldOf(func(o *Options) *int { return &o.Memcache.MaxIdleConns }, memcache.DefaultMaxIdleConns), doc: "idle connections kept per memcached server"},
	{name: "memcache-timeout", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.Memcache.Timeout }, memcache.DefaultTimeout), sum: "bound of each memcached call, and a decision's budget without a deadline", doc: "bound of each memcached call: socket and connect timeout, and a decision's budget when the caller's deadline (less 2 ms or a quarter of the time left) is later", shown: "`50ms` (reference mode: `500ms`, gomemcache's default)"},
	{name: "durable-url", group: groupBackend, field: fieldOf(func(o *Options) *string { return &o.DurableURL }, ""), sum: "PostgreSQL store of `store: durable` limits, `postgres://user@host:port/db`", doc: "PostgreSQL store of the limits with `store: durable` (`postgres://user@host:port/database`, libpq parameters such as `sslmode` in the query; percent-encode reserved characters of a password in it, such as `#` as `%23`, or use `--durable-password-file`): their counts survive a restart of ratelimitd and of Redis ([docs/quotas.md](docs/quotas.md#quotas-that-must-survive)); the schema is created or migrated at startup, or in the background once PostgreSQL answers (until then the durable limits get their `failure_mode`); empty: no durable store, and a config with `store: durable` is refused", shown: "(none)", secret: secrets.PostgresURL},
	{name: "durable-password-file", group: groupBackend, field: fieldOf(func(o *Options) *string { return &o.DurablePasswordFile }, ""), sum: "file holding the PostgreSQL password, read at startup", doc: "file holding the PostgreSQL password (a mounted Secret key; one trailing newline ignored), read at startup; wins over the URL's password"},
	{name: "durable-timeout", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.DurableTimeout }, postgres.DefaultTimeout), sum: "budget of a durable decision without an earlier caller deadline", doc: "budget of a durable decision when the caller's deadline (less 2 ms or a quarter of the time left) is later; a failure or timeout gives the durable limits their `failure_mode`"},
	{name: "durable-max-conns", group: groupBackend, field: fieldOf(func(o *Options) *int { return &o.DurableMaxConns }, postgres.DefaultMaxConns), sum: "connections in the PostgreSQL pool", doc: "connections in the PostgreSQL pool; durable decisions beyond it wait for one within their budget"},
	{name: "durable-connect-timeout", group: groupBackend, field: fieldOf(func(o *Options) *time.Duration { return &o.DurableConnect }, postgres.DefaultConnectTimeout), sum: "bound of each attempt to reach PostgreSQL and check its schema", doc: "bound of each attempt to reach PostgreSQL and check or migrate its schema: the one at startup (a schema newer than the binary fails startup; an unreachable PostgreSQL does not: ratelimitd starts with the durable store unhealthy) and each background retry, every 100 ms, until one succeeds"},
	{name: "durable-async-commit", group: groupBackend, field: fieldOf(func(o *Options) *bool { return &o.DurableAsyncCommit }, false), sum: "`synchronous_commit = off`: faster, a PostgreSQL crash loses its last counts", doc: "`synchronous_commit = off` for the durable store's sessions: a durable decision does not wait for its WAL to reach the disk (less latency, more throughput), and a crash of PostgreSQL loses the counts of its last moments (about 600 ms), whose requests were admitted ([docs/postgres.md](docs/postgres.md#asynchronous-commit))"},
	{name: "local-cache-size", group: groupBackend, legacyVia: "LOCAL_CACHE_SIZE_IN_BYTES", field: fieldOf(func(o *Options) *int { return &o.Redis.LocalCacheSize }, redis.DefaultLocalCacheSize).feeds(func(o *Options) any { return &o.Memcache.LocalCacheSize }), sum: "entries of the local over-limit cache (0 disables)", doc: "entries of the local over-limit cache (0 disables): denied keys answered locally until their retry time, kept exact across replicas on Redis ([docs/redis.md](docs/redis.md#local-over-limit-cache)); an upper bound, memory grows with use (about 200 bytes plus the key per entry)", shown: "`10000` on Redis in native mode; `0` in reference mode and on memcached"},
	// The default keeps the store's heap to what a small pod holds
	// (docs/operations.md gives the bytes per key).
	{name: "memory-max-keys", group: groupBackend, field: fieldOf(func(o *Options) *int { return &o.MemoryMaxKeys }, 1_000_000), sum: "keys the in-memory store may hold; 0 = unbounded", doc: "keys the in-memory store may hold (the memory backend, and the `failure_mode: local` fallback of the Redis backend); 0 = unbounded. About 110–130 bytes of live heap per key, so ≈ 110–130 MB at the default ([docs/operations.md](docs/operations.md#in-memory-store)). When full, a request that needs a new key drops an expired key for it; when none has expired, a new fixed-window, sliding-window or token-bucket key is decided by an approximate counter that never under-counts (so never admits it beyond its limit; it may deny it early), and a new sliding-log or concurrency key is denied, counted in `ratelimitd_memory_full_hits_total` ([docs/operations.md](docs/operations.md#in-memory-store)). Live keys are never dropped, and stored keys are decided exactly and as fast while full"},
	{name: "shadow-mode", group: groupAnswers, legacy: []string{"SHADOW_MODE"}, field: fieldOf(func(o *Options) *bool { return &o.Service.ShadowMode }, false), doc: "global shadow mode: evaluate and report, never deny"},
	{name: "quota-mode", group: groupAnswers, legacy: []string{"QUOTA_MODE"}, field: fieldOf(func(o *Options) *bool { return &o.Service.QuotaMode }, false), doc: "global quota mode: every descriptor is a soft limit"},
	{name: "counting", group: groupAnswers, field: fieldOf(func(o *Options) *string { return &o.Counting }, "all_or_nothing"), sum: "default counting policy: `all_or_nothing` or `always_charge`", doc: "counting policy of rules that set no `counting:` of their own: `all_or_nothing` (a denied request consumes nothing) or `always_charge` (every hit is charged even over the limit, as envoyproxy/ratelimit counts; post-paid costs sent at stream end then stop the client that spent them) ([docs/config.md](docs/config.md#counting-policy))"},
	{name: "mode", group: groupAnswers, field: fieldOf(func(o *Options) *string { return &o.Mode }, compat.ModeAuto), sum: "`auto`, `reference` (answer as envoyproxy/ratelimit) or `native`", doc: "`auto`: reference mode when envoyproxy/ratelimit's environment is in use (one of its config, backend or header variables such as `RUNTIME_ROOT`, `REDIS_URL`, `USE_STATSD`, `LIMIT_RESPONSE_HEADERS_ENABLED` is set, or the binary is invoked as `ratelimit`) and neither `--config` nor `RATELIMITD_CONFIG` is given; `reference` or `native` force it. Reference mode answers as envoyproxy/ratelimit does; one startup line says which mode is in force and why ([docs/migrating.md](docs/migrating.md#reference-mode))"},
	{name: "headers", group: groupAnswers, legacyVia: "LIMIT_RESPONSE_HEADERS_ENABLED", field: fieldOf(func(o *Options) *string { return &o.Headers }, "ietf"), sum: "`ietf`, `legacy` (three `X-RateLimit-*` headers), `both` or `none`", doc: "`ietf` (`RateLimit`, `RateLimit-Policy`), `legacy` (three headers, named by the next three flags), `both`, `none`", shown: "`ietf` (reference mode: `none`, or `legacy` with `LIMIT_RESPONSE_HEADERS_ENABLED=true`)"},
	{name: "legacy-limit-header", group: groupAnswers, legacyVia: "LIMIT_LIMIT_HEADER", field: fieldOf(func(o *Options) *string { return &o.LegacyLimitHeader }, service.HeaderLegacyLimit), sum: "name of the legacy limit header", doc: "names of the legacy headers: the chosen limit's `requests_per_unit`, `limit_remaining` and seconds until reset; `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER` set them", shown: "`X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (reference mode: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`)"},
	{name: "legacy-remaining-header", group: groupAnswers, legacyVia: "LIMIT_REMAINING_HEADER", field: fieldOf(func(o *Options) *string { return &o.LegacyRemainingHeader }, service.HeaderLegacyRemaining), doc: "name of the legacy remaining header (limit_remaining); reference mode: RateLimit-Remaining", joins: "legacy-limit-header"},
	{name: "legacy-reset-header", group: groupAnswers, legacyVia: "LIMIT_RESET_HEADER", field: fieldOf(func(o *Options) *string { return &o.LegacyResetHeader }, service.HeaderLegacyReset), doc: "name of the legacy reset header (seconds until reset); reference mode: RateLimit-Reset", joins: "legacy-limit-header"},
	{name: "problem-body", group: groupAnswers, field: fieldOf(func(o *Options) *bool { return &o.ProblemBody }, true), sum: "on OVER_LIMIT add `Retry-After` and an RFC 9457 problem body", doc: "on OVER_LIMIT add `Retry-After`, `Content-Type: application/problem+json` and the RFC 9457 body ([docs/responses.md](docs/responses.md))", shown: "`true` (reference mode: `false`)"},
	{name: "near-limit-ratio", group: groupAnswers, legacy: []string{"NEAR_LIMIT_RATIO"}, field: fieldOf(func(o *Options) *float64 { return &o.Service.NearLimitRatio }, 0.8), doc: "share of a limit after which a decision counts as `near_limit`"},
	{name: "retry-jitter", group: groupAnswers, field: fieldOf(func(o *Options) *time.Duration { return &o.RetryJitter }, time.Second), doc: "maximum jitter added to `Retry-After` (`0s` disables it)"},
	{name: "request-overrides", group: groupAnswers, field: fieldOf(func(o *Options) *bool { return &o.RequestOverrides }, true), sum: "honour per-descriptor limit overrides sent by Envoy", doc: "honour per-descriptor limit overrides sent by Envoy; the config's `override:` field may ignore, lower-only or cap them per rule or domain ([docs/config.md](docs/config.md#request-overrides))"},
	{name: "near-limit-header", group: groupAnswers, field: fieldOf(func(o *Options) *bool { return &o.Service.NearLimitHeader }, false), doc: "add `Ratelimitd-Near-Limit`, the policies past `--near-limit-ratio` ([docs/responses.md](docs/responses.md))"},
	{name: "problem-type-base", group: groupAnswers, field: fieldOf(func(o *Options) *string { return &o.Service.ProblemTypeBase }, service.DefaultProblemTypeBase), doc: "prefix of the RFC 9457 problem `type` (`quota-exceeded`, `temporary-reduced-capacity`)"},
	{name: "problem-detail", group: groupAnswers, field: fieldOf(func(o *Options) *string { return &o.Service.ProblemDetail }, ""), doc: "problem `detail` template; placeholders `{policy}`, `{quota}`, `{window}`, `{retry_after}` (seconds)", shown: "(built-in sentence)"},
	{name: "fail-closed-retry-after", group: groupAnswers, field: fieldOf(func(o *Options) *time.Duration { return &o.Service.FailClosedRetryAfter }, service.DefaultFailClosedRetryAfter), doc: "`Retry-After` base when `failure_mode: closed` denies because the backend failed"},
	{name: "detailed-metric-cap", group: groupTelemetry, field: fieldOf(func(o *Options) *int { return &o.Service.DetailedMetricCap }, service.DefaultDetailedMetricCap), sum: "distinct `rule` label values of `detailed_metric` rules; negative disables", doc: "distinct `rule` label values from `detailed_metric` rules in the process's life (reloads do not grant more), then `_other`; negative disables detailed labels ([docs/metrics.md](docs/metrics.md))"},
	{name: "lease-interval", group: groupAnswers, field: fieldOf(func(o *Options) *time.Duration { return &o.Lease.Interval }, lease.DefaultInterval), sum: "`consistency: leased` limits: how often each lease is renewed", doc: "`consistency: leased` limits ([docs/leases.md](docs/leases.md)): every this long an instance renews each lease it uses and shares its demand (a quarter window when that is shorter); longer intervals mean fewer store calls and larger leases, so more units held unused when demand moves; at least `1ms`"},
	{name: "rlqs-interval", group: groupAnswers, field: fieldOf(func(o *Options) *time.Duration { return &o.RLQS.Interval }, rlqs.DefaultInterval), sum: "RLQS: how often usage is charged and limits divided among the Envoys", doc: "RLQS (Envoy's `rate_limit_quota` filter, [docs/rlqs.md](docs/rlqs.md)): every this long the reported usage is charged and each limit divided again among the Envoys; set Envoy's `reporting_interval` to the same"},
	{name: "rlqs-abandon-after", group: groupAnswers, field: fieldOf(func(o *Options) *time.Duration { return &o.RLQS.AbandonAfter }, rlqs.DefaultAbandonAfter), sum: "RLQS: a bucket not reported for this long is abandoned", doc: "RLQS: a bucket not reported for this long is sent an `AbandonAction` and forgotten; several reporting intervals"},
	{name: "rlqs-headroom", group: groupAnswers, field: fieldOf(func(o *Options) *float64 { return &o.RLQS.Headroom }, rlqs.DefaultHeadroom), sum: "RLQS: share of each limit the Envoys' full token buckets hold together", doc: "RLQS: share of each limit the Envoys' full token buckets hold together; the assigned rates share the rest, so a window never admits more than the limit"},
	{name: "rlqs-max-buckets-per-stream", group: groupAnswers, field: fieldOf(func(o *Options) *int { return &o.RLQS.MaxBucketsPerStream }, rlqs.DefaultMaxBucketsPerStream), sum: "RLQS: most buckets one Envoy stream may have", doc: "RLQS: most buckets one Envoy stream may have; a bucket reported past it is not charged and is answered `DENY_ALL` (`ALLOW_ALL` when its rule never denies), counted in `ratelimitd_rlqs_buckets_over_bound_total` ([docs/rlqs.md](docs/rlqs.md#bounds-on-one-stream))"},
	{name: "dynamic-metadata", group: groupAnswers, legacy: []string{"RESPONSE_DYNAMIC_METADATA"}, field: fieldOf(func(o *Options) *bool { return &o.Service.DynamicMetadata }, false), doc: "fill `RateLimitResponse.dynamic_metadata`"},
	{name: "merge-domains", group: groupConfig, legacy: []string{"MERGE_DOMAIN_CONFIG"}, field: fieldOf(func(o *Options) *bool { return &o.MergeDomains }, false), doc: "let several files contribute to one domain"},
	// The default bounds the policy's live heap, which doubles while a
	// reload swaps (docs/config.md gives the heap per rule).
	{name: "max-config-rules", group: groupConfig, field: fieldOf(func(o *Options) *int { return &o.MaxConfigRules }, 50_000), sum: "most rules a loaded config may hold; a larger one is refused (0 = no limit)", doc: "most rules a loaded config may hold, at startup and at every reload; a larger config is refused with `config too large: N rules, more than the limit of M` and the config in force stays (at startup: not serving until a config that fits loads); 0 = no limit. A loaded config keeps ≈ 10.7 MB of heap per 10,000 rules, and a load allocates ≈ 46 MB per 10,000 ([docs/config.md](docs/config.md#reload))"},
	// A load allocates in proportion to the config's size (docs/config.md).
	{name: "max-config-bytes", group: groupConfig, field: fieldOf(func(o *Options) *int64 { return &o.MaxConfigBytes }, 8<<20), sum: "most bytes the config files may hold; a larger config is refused (0 = no limit)", doc: "most bytes the config files may hold together (8 MiB), checked by size before anything is read or parsed, at startup and at every reload; a larger config is refused with `config too large: more than the limit of N bytes` and the config in force stays; 0 = no limit. A load allocates ≈ 46 bytes per config byte ([docs/config.md](docs/config.md#reload))"},
	// Kubernetes ConfigMap mounts hold ..data and timestamped dot
	// directories; loading them would load every file twice.
	{name: "ignore-dotfiles", group: groupConfig, legacy: []string{"RUNTIME_IGNOREDOTFILES"}, field: fieldOf(func(o *Options) *bool { return &o.IgnoreDotfiles }, true), sum: "skip dot files and directories (Kubernetes ConfigMap `..data`)", doc: "skip dot files and directories (Kubernetes ConfigMap `..data`); `--ignore-dotfiles=false` loads them"},
	{name: "key-prefix", group: groupBackend, legacyVia: "CACHE_KEY_PREFIX", field: fieldOf(func(o *Options) *string { return &o.KeyPrefix }, ""), doc: "prefix of every backend key"},
	{name: "key-values", group: groupBackend, field: fieldOf(func(o *Options) *string { return &o.KeyValues }, "hash"), doc: "descriptor values in backend keys: `hash`, or `clear` (development only)"},
	{name: "log-level", group: groupTelemetry, legacyVia: "LOG_LEVEL", field: fieldOf(func(o *Options) *string { return &o.LogLevel }, "info"), doc: "`debug`, `info`, `warn`, `error` (any case)"},
	{name: "log-format", group: groupTelemetry, legacy: []string{"LOG_FORMAT"}, field: fieldOf(func(o *Options) *string { return &o.LogFormat }, "text"), sum: "`text` or `json`", doc: "`text` or `json`; go-redis' own messages are logged through it too (`\"redis client\"`, WARN at most once per 10 s per kind, the rest at DEBUG)"},
	{name: "gc-percent", group: groupRuntime, field: fieldOf(func(o *Options) *int { return &o.GCPercent }, gcpolicy.DefaultPercent), sum: "Go GC target unless `GOGC` is set; `-1` turns the GC off", doc: "Go GC target unless `GOGC` is set; `-1` turns the GC off (only with a memory limit) ([docs/operations.md](docs/operations.md#go-gc-and-memory-limit))"},
	{name: "memory-limit", group: groupRuntime, field: fieldOf(func(o *Options) *gcpolicy.ByteSize { return &o.MemoryLimit }, 0), sum: "Go soft memory limit in bytes unless `GOMEMLIMIT` is set; 0: from the cgroup", doc: "Go soft memory limit in bytes unless `GOMEMLIMIT` is set, e.g. `400MiB` (at least `16MiB`); `0` derives it from the cgroup limit", arg: "bytes"},
	{name: "memory-limit-ratio", group: groupRuntime, field: fieldOf(func(o *Options) *float64 { return &o.MemoryLimitRatio }, gcpolicy.DefaultMemoryLimitRatio), sum: "the soft memory limit as a share of the cgroup memory limit (0: none)", doc: "without `--memory-limit` or `GOMEMLIMIT`: the soft memory limit as a share of the container's cgroup memory limit (`0`: none)"},
	{name: "drain", group: groupListeners, field: fieldOf(func(o *Options) *time.Duration { return &o.Drain }, 0), doc: "on SIGTERM, report NOT_SERVING this long before closing the listeners"},
	{name: "shutdown-grace", group: groupListeners, field: fieldOf(func(o *Options) *time.Duration { return &o.ShutdownGrace }, 15*time.Second), doc: "on SIGTERM, wait at most this long for in-flight calls"},
	{name: "grpc-tls-cert", group: groupListeners, legacyVia: "GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT", field: fieldOf(func(o *Options) *string { return &o.GRPCTLSCert }, ""), doc: "gRPC server TLS; files are reloaded when they change", shown: "(none)"},
	{name: "grpc-tls-key", group: groupListeners, legacyVia: "GRPC_SERVER_TLS_KEY", field: fieldOf(func(o *Options) *string { return &o.GRPCTLSKey }, ""), doc: "gRPC server private key (PEM)", joins: "grpc-tls-cert"},
	{name: "grpc-tls-client-ca", group: groupListeners, legacyVia: "GRPC_CLIENT_TLS_CACERT", field: fieldOf(func(o *Options) *string { return &o.GRPCTLSClientCA }, ""), doc: "require client certificates from this CA (mTLS)"},
	{name: "grpc-tls-client-san", group: groupListeners, legacyVia: "GRPC_CLIENT_TLS_SAN", field: fieldOf(func(o *Options) *string { return &o.GRPCTLSClientSAN }, ""), doc: "also require this SAN in the client certificate"},
	{name: "http-tls", group: groupListeners, field: fieldOf(func(o *Options) *bool { return &o.HTTPTLS }, false), sum: "serve the HTTP listener with the gRPC certificate", doc: "serve the HTTP listener (`/healthcheck`, `/json`, `/metrics`) with the gRPC certificate; under gRPC mTLS, `POST /json` then needs a client certificate that gRPC would accept. While gRPC uses TLS and this is off, `/json` answers 403 ([docs/security.md](docs/security.md#trust-boundaries))"},
	{name: "grpc-max-recv-msg-size", group: groupListeners, field: fieldOf(func(o *Options) *int { return &o.GRPCMaxRecvMsgSize }, defaultGRPCMaxRecvMsgSize), sum: "largest gRPC message (and `POST /json` body) received, in bytes", doc: "largest gRPC message received, in bytes; a larger one fails with `ResourceExhausted` before it is decoded. Also bounds the `POST /json` body (413 beyond it) ([docs/security.md](docs/security.md#resource-bounds))"},
	{name: "grpc-max-concurrent-streams", group: groupListeners, field: fieldOf(func(o *Options) *int { return &o.GRPCMaxConcurrentStreams }, defaultGRPCMaxConcurrentStreams), sum: "gRPC calls one client connection may have in flight", doc: "gRPC calls one client connection may have in flight; further calls wait for one to end (grpc-go and Envoy honour the advertised limit; a client that does not gets `REFUSED_STREAM`)"},
	{name: "grpc-max-connections", group: groupListeners, field: fieldOf(func(o *Options) *int { return &o.GRPCMaxConnections }, 0), sum: "gRPC client connections open at once; 0 = unbounded", doc: "gRPC client connections open at once; further ones wait to be accepted and their calls run into their deadlines; `0` = unbounded (size it to your Envoy workers × replicas, [docs/security.md](docs/security.md#resource-bounds))"},
	{name: "grpc-max-connection-age", group: groupListeners, legacy: []string{"GRPC_MAX_CONNECTION_AGE"}, field: fieldOf(func(o *Options) *time.Duration { return &o.GRPCMaxConnectionAge }, defaultGRPCMaxConnectionAge), sum: "send GOAWAY to a gRPC connection after this long, to rebalance; 0 = never", doc: "after this long (±10% jitter, added by grpc-go) a gRPC client connection is sent GOAWAY: Envoy opens a new one for its next calls, balanced over the current endpoints, so replicas a HorizontalPodAutoscaler adds get traffic from Envoys already running (envoyproxy/ratelimit `GRPC_MAX_CONNECTION_AGE`, default there 24h); `0` = never"},
	{name: "grpc-max-connection-age-grace", group: groupListeners, legacy: []string{"GRPC_MAX_CONNECTION_AGE_GRACE"}, field: fieldOf(func(o *Options) *time.Duration { return &o.GRPCMaxConnectionAgeGrace }, defaultGRPCMaxConnectionAgeGrace), sum: "after that GOAWAY, how long calls in flight may run; 0 = no bound", doc: "after that GOAWAY, calls in flight on the old connection may run this long before it is closed (`GRPC_MAX_CONNECTION_AGE_GRACE`); `0` = no bound"},
	{name: "http-read-timeout", group: groupListeners, field: fieldOf(func(o *Options) *time.Duration { return &o.HTTPReadTimeout }, 10*time.Second), sum: "HTTP listeners: time to read a whole request", doc: "HTTP listeners: time to read a whole request, headers and body; a slower client is disconnected"},
	{name: "http-write-timeout", group: groupListeners, field: fieldOf(func(o *Options) *time.Duration { return &o.HTTPWriteTimeout }, 10*time.Second), sum: "HTTP listeners but debug: time from the request headers to the response's end", doc: "HTTP listener and `--metrics-addr` (not the debug listener): time from the end of the request headers to the end of the response"},
	{name: "http-idle-timeout", group: groupListeners, field: fieldOf(func(o *Options) *time.Duration { return &o.HTTPIdleTimeout }, 2*time.Minute), doc: "HTTP listeners: a keep-alive connection without a new request for this long is closed"},
	{name: "tracing", group: groupTelemetry, legacy: []string{"TRACING_ENABLED"}, field: fieldOf(func(o *Options) *bool { return &o.Telemetry.Enabled }, false), sum: "export OpenTelemetry spans over OTLP/gRPC", doc: "export OpenTelemetry spans (one per `ShouldRateLimit`, a child per backend call) over OTLP/gRPC; Envoy's W3C `traceparent` is continued"},
	{name: "tracing-endpoint", group: groupTelemetry, field: fieldOf(func(o *Options) *string { return &o.Telemetry.Endpoint }, ""), doc: "OTLP/gRPC collector `host:port`; empty uses `OTEL_EXPORTER_OTLP_ENDPOINT`, else `localhost:4317`", secret: secrets.Address},
	{name: "tracing-insecure", group: groupTelemetry, field: fieldOf(func(o *Options) *bool { return &o.Telemetry.Insecure }, false), doc: "plaintext to the collector (node-local collector or mesh sidecar)"},
	{name: "tracing-sample-ratio", group: groupTelemetry, legacy: []string{"TRACING_SAMPLING_RATE"}, field: fieldOf(func(o *Options) *float64 { return &o.Telemetry.SampleRatio }, 1), sum: "share of root spans sampled, 0 to 1; a sampled parent is always followed", doc: "share of root spans sampled, 0 to 1 (0: none); a sampled parent from Envoy is always followed"},
	{name: "tracing-service-name", group: groupTelemetry, legacy: []string{"TRACING_SERVICE_NAME"}, field: fieldOf(func(o *Options) *string { return &o.Telemetry.ServiceName }, "ratelimitd"), doc: "`service.name` of exported spans"},
}

// Defaults are the defaults of every setting (the table's), plus
// the fields no flag sets.
func Defaults() Options {
	o := Options{Redis: redis.DefaultOptions(), Memcache: memcache.DefaultOptions()}
	for _, s := range settings {
		s.field.setDefault(&o)
	}
	// envoyproxy/ratelimit with no environment: USE_STATSD=true,
	// STATSD_HOST=localhost, STATSD_PORT=8125.
	o.StatsdReferenceAddr = "localhost:8125"
	return o
}

// registerServeFlags binds every setting's flag to its field of o; the
// field's current value is the flag's default. It returns the list
// flags, whose sources (environment, command line) replace one another.
func registerServeFlags(fs *flag.FlagSet, o *Options) []*listValue {
	var lists []*listValue
	for _, s := range settings {
		usage := helpText(s.summary())
		if s.arg != "" {
			if !strings.Contains(usage, s.arg) {
				panic(fmt.Sprintf("setting --%s: arg %q is not a word of its doc", s.name, s.arg))
			}
			// The flag package takes a backquoted word for the value's name.
			usage = strings.Replace(usage, s.arg, "`"+s.arg+"`", 1)
		}
		switch p := s.field.ptr(o).(type) {
		case *string:
			fs.StringVar(p, s.name, *p, usage)
		case *bool:
			fs.BoolVar(p, s.name, *p, usage)
		case *int:
			fs.IntVar(p, s.name, *p, usage)
		case *int64:
			fs.Int64Var(p, s.name, *p, usage)
		case *float64:
			fs.Float64Var(p, s.name, *p, usage)
		case *time.Duration:
			fs.DurationVar(p, s.name, *p, usage)
		case *[]string:
			l := &listValue{p: p}
			fs.Var(l, s.name, usage)
			lists = append(lists, l)
		case *gcpolicy.ByteSize, *notBool:
			fs.Var(p.(flag.Value), s.name, usage)
		default:
			panic(fmt.Sprintf("setting --%s: unsupported field type %T", s.name, p))
		}
	}
	return lists
}

// summary is the setting's one-line doc: sum, or doc when it is short.
func (s setting) summary() string {
	if s.sum != "" {
		return s.sum
	}
	return s.doc
}

// markdownLink matches a Markdown link, "[text](target)".
var markdownLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// helpText is a doc line as -h prints it: links become their text and
// backquotes go (the flag package would take a backquoted word for the
// value's name; registerServeFlags adds the setting's arg back).
func helpText(doc string) string {
	return strings.ReplaceAll(markdownLink.ReplaceAllString(doc, "$1"), "`", "")
}

// setLegacy parses v into the field p points to as envoyproxy/ratelimit
// parses it: strconv.ParseBool, strconv.Atoi, strconv.ParseFloat,
// parseDuration, a comma-separated list or a string as is (legacyTable).
func setLegacy(p any, v string) error {
	var err error
	switch p := p.(type) {
	case *string:
		*p = v
	case *bool:
		var b bool
		if b, err = strconv.ParseBool(v); err == nil {
			*p = b
		}
	case *int:
		var n int
		if n, err = strconv.Atoi(v); err == nil {
			*p = n
		}
	case *float64:
		var f float64
		if f, err = strconv.ParseFloat(v, 64); err == nil {
			*p = f
		}
	case *time.Duration:
		var d time.Duration
		if d, err = parseDuration(v); err == nil {
			*p = d
		}
	case *[]string:
		*p = splitList(v)
	default:
		err = fmt.Errorf("no plain legacy mapping for %T", p)
	}
	return err
}
