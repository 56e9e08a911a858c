package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
)

// Migration from envoyproxy/ratelimit: its environment variables are
// read where their meaning
// maps onto ratelimitd; docs/migrating.md has the table. They rank below
// the RATELIMITD_* twins and the flags.

// legacyIgnored are envoyproxy/ratelimit variables that need no setting here
// because ratelimitd already behaves that way (or the variable only tunes a
// mechanism ratelimitd does not have), whatever their value.
var legacyIgnored = map[string]string{
	"RUNTIME_WATCH_ROOT":                      "config directories are always watched",
	"REDIS_SOCKET_TYPE":                       "read with REDIS_URL",
	"REDIS_PIPELINE_WINDOW":                   "no effect: one script call per request",
	"REDIS_PIPELINE_LIMIT":                    "no effect: one script call per request",
	"REDIS_CLUSTER_PIPELINE_PARALLELISM":      "no effect: one script call per request",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR":            "no effect",
	"EXPIRATION_JITTER_MAX_SECONDS":           "no effect: keys expire exactly when their state is full again",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "always: health is NOT_SERVING until the first good config",
	"FORCE_START_WITHOUT_INITIAL_CONFIG":      "always: listeners start at once, health NOT_SERVING until the first good config (from files or xDS)",
	"PROMETHEUS_PATH":                         "checked below",
}

// legacyUnsupported lists variables (or prefixes, ending in "_") whose
// meaning has no ratelimitd equivalent; any that is set is named in the one
// startup warning.
var legacyUnsupported = []string{
	"GRPC_UDS",
	"USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS",
	"PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
	"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
	"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME",
	"REDIS_PERSECOND", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL",
	"REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH",
	"REDIS_PERSECOND_TIMEOUT", "REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT",
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
	"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	"TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
}

// legacyUnsupportedWarning begins the one startup warning naming the
// variables ratelimitd cannot honour (a comma-separated list follows).
const legacyUnsupportedWarning = "envoyproxy/ratelimit environment variables set but not supported by ratelimitd (ignored; see docs/migrating.md): "

// statsdOnlyWithUse follows STATSD_HOST or STATSD_PORT in that warning
// when USE_STATSD is unset (reference mode honours them, see
// referenceWarnings).
const statsdOnlyWithUse = " (statsd is sent only with USE_STATSD=true or --statsd-addr)"

// legacyCacheEntryBytes converts LOCAL_CACHE_SIZE_IN_BYTES (a freecache
// size) into --local-cache-size entries: one entry per this many bytes.
const legacyCacheEntryBytes = 128

// applyLegacyEnv maps envoyproxy/ratelimit variables onto o: the plain
// ones of the settings table (applyLegacyTable), then those with rules of
// their own. It returns at most one warning, naming every set variable
// that ratelimitd cannot honour, and an error for a set variable whose
// value is malformed or that selects something ratelimitd refuses to
// imitate silently (MEMCACHE_TLS=true, a CONFIG_TYPE other than FILE and
// GRPC_XDS_SOTW).
func applyLegacyEnv(o *Options, lookup func(string) (string, bool)) ([]string, error) {
	l := &legacyEnv{lookup: lookup}
	// The plain one-to-one variables first: the rules below may read them
	// (CONFIG_GRPC_XDS_SERVER_USE_TLS).
	applyLegacyTable(o, l.get, &l.errs)
	l.listeners(o)
	l.config(o)
	l.backend(o)
	l.answers(o)
	l.metrics(o)
	for _, name := range legacyUnsupported {
		_, ok := lookup(name)
		l.unsupportedIf(name, ok)
	}
	var warnings []string
	if len(l.unsupported) > 0 {
		warnings = append(warnings, legacyUnsupportedWarning+strings.Join(l.unsupported, ", "))
	}
	return warnings, errors.Join(l.errs...)
}

// legacyEnv is one reading of the envoyproxy/ratelimit variables: the
// errors and the unsupported variables found so far.
type legacyEnv struct {
	lookup      func(string) (string, bool)
	errs        []error
	unsupported []string
}

// get is lookup with the value trimmed.
func (l *legacyEnv) get(name string) (string, bool) {
	v, ok := l.lookup(name)
	return strings.TrimSpace(v), ok
}

// boolVar sets *dst from name when it is set and not empty.
func (l *legacyEnv) boolVar(name string, dst *bool) {
	if v, ok := l.get(name); ok && v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			l.errs = append(l.errs, fmt.Errorf("%s=%q: %w", name, v, err))
			return
		}
		*dst = b
	}
}

// unsupportedIf names name in the warning when cond holds.
func (l *legacyEnv) unsupportedIf(name string, cond bool) {
	if cond {
		l.unsupported = append(l.unsupported, name)
	}
}

// listeners maps HOST/PORT, GRPC_HOST/GRPC_PORT and DEBUG_HOST/DEBUG_PORT.
func (l *legacyEnv) listeners(o *Options) {
	addr := func(hostVar, portVar string, dst *string) {
		h, hok := l.get(hostVar)
		p, pok := l.get(portVar)
		if !hok && !pok {
			return
		}
		host, port, err := net.SplitHostPort(*dst)
		if err != nil {
			host, port = "", *dst
		}
		if hok {
			host = h
		}
		if pok {
			if _, err := strconv.ParseUint(p, 10, 16); err != nil {
				l.errs = append(l.errs, fmt.Errorf("%s=%q: not a port number", portVar, p))
				return
			}
			port = p
		}
		*dst = net.JoinHostPort(host, port)
	}
	addr("GRPC_HOST", "GRPC_PORT", &o.GRPCAddr)
	addr("HOST", "PORT", &o.HTTPAddr)
	addr("DEBUG_HOST", "DEBUG_PORT", &o.DebugAddr)
}

// config maps the config location (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY,
// RUNTIME_APPDIRECTORY), CONFIG_TYPE, the xDS TLS files and
// TRACING_EXPORTER_PROTOCOL.
func (l *legacyEnv) config(o *Options) {
	// Config location: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
	if dir, ok := legacyConfigDir(l.get); ok {
		o.legacySeen.configDir = true
		o.Config = []string{dir}
	}

	// Tracing: OTLP over gRPC only (TRACING_EXPORTER_PROTOCOL=http is not).
	if v, ok := l.get("TRACING_EXPORTER_PROTOCOL"); ok && !strings.EqualFold(v, "grpc") {
		l.unsupportedIf("TRACING_EXPORTER_PROTOCOL="+v+" (only grpc)", true)
	}
	if v, ok := l.get("CONFIG_TYPE"); ok && v != "" {
		switch strings.ToUpper(v) {
		case "FILE":
			o.ConfigSource = "file"
		case "GRPC_XDS_SOTW":
			o.ConfigSource = "xds"
		default:
			l.errs = append(l.errs, fmt.Errorf("CONFIG_TYPE=%q: want FILE (config files) or GRPC_XDS_SOTW (xDS)", v))
		}
	}
	legacyXDS(o, l.get)
}

// legacyConfigDir is envoyproxy/ratelimit's config directory,
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY (defaults
// /srv/runtime_data/current, "" and config); ok is false when none of the
// three is set.
func legacyConfigDir(get func(string) (string, bool)) (dir string, ok bool) {
	root, rok := get("RUNTIME_ROOT")
	sub, sok := get("RUNTIME_SUBDIRECTORY")
	app, aok := get("RUNTIME_APPDIRECTORY")
	if !rok && !sok && !aok {
		return "", false
	}
	if root == "" {
		root = "/srv/runtime_data/current"
	}
	if app == "" {
		app = "config"
	}
	return filepath.Join(root, sub, app), true
}

// backend maps BACKEND_TYPE, the Redis location (legacyRedis),
// MEMCACHE_TLS, LOCAL_CACHE_SIZE_IN_BYTES and CACHE_KEY_PREFIX.
func (l *legacyEnv) backend(o *Options) {
	redisType, typeSet := l.get("REDIS_TYPE")
	redisURL, urlSet := l.get("REDIS_URL")
	_, backendSet := l.get("BACKEND_TYPE")
	o.legacySeen.backend = backendSet || typeSet || urlSet
	if v, ok := l.get("BACKEND_TYPE"); ok {
		switch strings.ToLower(v) {
		case "redis", "":
			o.Backend = "redis"
		case "memcache":
			o.Backend = "memcache"
		default:
			l.errs = append(l.errs, fmt.Errorf("BACKEND_TYPE=%q: want redis or memcache", v))
		}
	} else if typeSet || urlSet {
		// envoyproxy/ratelimit's default backend is Redis.
		o.Backend = "redis"
	}
	if typeSet || urlSet {
		if err := legacyRedis(o, redisType, redisURL, urlSet, l.lookup); err != nil {
			l.errs = append(l.errs, err)
		}
	}
	// memcached (BACKEND_TYPE=memcache): MEMCACHE_HOST_PORT is
	// "host:port,host:port"; both it and MEMCACHE_SRV set is refused by
	// Options.Validate, as envoyproxy/ratelimit refuses it at startup.
	if v, ok := l.get("MEMCACHE_TLS"); ok && v != "" {
		b, err := strconv.ParseBool(v)
		switch {
		case err != nil:
			l.errs = append(l.errs, fmt.Errorf("MEMCACHE_TLS=%q: %w", v, err))
		case b:
			// Connecting in plaintext to a TLS port would fail every call.
			l.errs = append(l.errs, errors.New("MEMCACHE_TLS=true: TLS to memcached is not supported; use a TLS-terminating sidecar or the redis backend"))
		}
	}
	if v, ok := l.get("LOCAL_CACHE_SIZE_IN_BYTES"); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			l.errs = append(l.errs, fmt.Errorf("LOCAL_CACHE_SIZE_IN_BYTES=%q: not a size in bytes", v))
		} else {
			o.legacySeen.localCache = true
			o.Redis.LocalCacheSize = 0
			if n > 0 {
				o.Redis.LocalCacheSize = max(1, n/legacyCacheEntryBytes)
			}
		}
	}
	if v, ok := l.get("CACHE_KEY_PREFIX"); ok {
		o.KeyPrefix = v
	}
}

// answers maps the response headers, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
// and LOG_LEVEL.
func (l *legacyEnv) answers(o *Options) {
	// LIMIT_RESPONSE_HEADERS_ENABLED: the reference's three headers, or
	// none; their names are LIMIT_*_HEADER's (reference mode gives them
	// the reference's defaults when unset, see applyReferenceDefaults).
	if v, ok := l.get("LIMIT_RESPONSE_HEADERS_ENABLED"); ok && v != "" {
		o.legacySeen.headersFlag = true
		b, err := strconv.ParseBool(v)
		if err != nil {
			l.errs = append(l.errs, fmt.Errorf("LIMIT_RESPONSE_HEADERS_ENABLED=%q: %w", v, err))
		} else if b {
			o.Headers = "legacy"
		} else {
			o.Headers = "none"
		}
	}

	for _, h := range []struct {
		name string
		seen *bool
		dst  *string
	}{
		{"LIMIT_LIMIT_HEADER", &o.legacySeen.limitName, &o.LegacyLimitHeader},
		{"LIMIT_REMAINING_HEADER", &o.legacySeen.remainName, &o.LegacyRemainingHeader},
		{"LIMIT_RESET_HEADER", &o.legacySeen.resetName, &o.LegacyResetHeader},
	} {
		if v, ok := l.get(h.name); ok && v != "" {
			*h.seen, *h.dst = true, v
		}
	}
	// Counting of hits in denied requests (the counting policy reads it;
	// see Options.ReferenceCounting).
	l.boolVar("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", &o.StopIncrementWhenOverLimit)

	// Logging (logrus level names).
	if v, ok := l.get("LOG_LEVEL"); ok && v != "" {
		switch strings.ToLower(v) {
		case "trace", "debug":
			o.LogLevel = "debug"
		case "info":
			o.LogLevel = "info"
		case "warn", "warning":
			o.LogLevel = "warn"
		case "error", "fatal", "panic":
			o.LogLevel = "error"
		default:
			l.errs = append(l.errs, fmt.Errorf("LOG_LEVEL=%q: unknown level", v))
		}
	}
}

// metrics maps statsd (legacyStatsd, STATSD_PROTOCOL), Prometheus
// (USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH) and the gRPC server
// TLS variables.
func (l *legacyEnv) metrics(o *Options) {
	// Metrics: statsd (plain, over UDP) and Prometheus map; dogstatsd
	// does not.
	if err := legacyStatsd(o, l.get, &l.unsupported); err != nil {
		l.errs = append(l.errs, err)
	}
	if v, ok := l.get("STATSD_PROTOCOL"); ok && v != "" && !strings.EqualFold(v, "udp") {
		l.unsupportedIf("STATSD_PROTOCOL="+v+" (statsd is sent over UDP)", o.StatsdAddr != "" || o.StatsdReferenceAddr != "")
	}
	if v, ok := l.get("USE_PROMETHEUS"); ok && v != "" {
		// A malformed value is reported by legacyStatsd.
		if b, err := strconv.ParseBool(v); err == nil && b {
			o.MetricsAddr = ":9090"
			if a, ok := l.get("PROMETHEUS_ADDR"); ok && a != "" {
				o.MetricsAddr = a
			}
		}
	}
	if v, ok := l.get("PROMETHEUS_PATH"); ok && v != "" && v != "/metrics" {
		l.unsupported = append(l.unsupported, "PROMETHEUS_PATH")
	}

	// gRPC server TLS.
	var useTLS bool
	l.boolVar("GRPC_SERVER_USE_TLS", &useTLS)
	if useTLS {
		o.GRPCTLSCert, _ = l.get("GRPC_SERVER_TLS_CERT")
		o.GRPCTLSKey, _ = l.get("GRPC_SERVER_TLS_KEY")
		o.GRPCTLSClientCA, _ = l.get("GRPC_CLIENT_TLS_CACERT")
		o.GRPCTLSClientSAN, _ = l.get("GRPC_CLIENT_TLS_SAN")
		if o.GRPCTLSCert == "" || o.GRPCTLSKey == "" {
			// Serving plaintext instead would silently drop the TLS asked
			// for; envoyproxy/ratelimit fails to load an empty path too.
			l.errs = append(l.errs, errors.New("GRPC_SERVER_USE_TLS=true: needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"))
		}
	}
}

// legacyStatsd maps USE_STATSD, STATSD_HOST, STATSD_PORT,
// STATS_FLUSH_INTERVAL, EXTRA_TAGS (--statsd-tags) and DISABLE_STATS. envoyproxy/ratelimit sends
// statsd to STATSD_HOST:STATSD_PORT (defaults localhost, 8125) unless
// USE_STATSD is false (its default is true), DISABLE_STATS is true, or
// another sink (USE_PROMETHEUS, USE_DOG_STATSD) is chosen. ratelimitd
// sends only when USE_STATSD=true is set explicitly (o.StatsdAddr); what
// the reference would do with USE_STATSD unset is recorded in
// o.StatsdReferenceAddr for reference-mode wiring, and STATSD_HOST or
// STATSD_PORT set without it is named in the unsupported warning.
func legacyStatsd(o *Options, get func(string) (string, bool), unsupported *[]string) error {
	var errs []error
	use, useSet := false, false
	if v, ok := get("USE_STATSD"); ok && v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("USE_STATSD=%q: %w", v, err))
		}
		use, useSet = b, true
	}
	// isTrue reads a boolean variable; a malformed value is an error.
	isTrue := func(name string) bool {
		v, ok := get(name)
		if !ok || v == "" {
			return false
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
		return b
	}
	// Each read once, whatever the others say, so that every malformed
	// value is reported.
	disable, prometheus, dogStatsd := isTrue("DISABLE_STATS"), isTrue("USE_PROMETHEUS"), isTrue("USE_DOG_STATSD")
	if disable {
		use, useSet = false, true
	}
	host, port := "localhost", "8125"
	if v, ok := get("STATSD_HOST"); ok && v != "" {
		host = v
	}
	if v, ok := get("STATSD_PORT"); ok && v != "" {
		if _, err := strconv.ParseUint(v, 10, 16); err != nil {
			errs = append(errs, fmt.Errorf("STATSD_PORT=%q: not a port number", v))
		}
		port = v
	}
	addr := net.JoinHostPort(host, port)
	o.StatsdReferenceAddr = ""
	switch {
	case useSet && use:
		o.StatsdAddr = addr
	case !useSet && !prometheus && !dogStatsd:
		o.StatsdReferenceAddr = addr
		for _, name := range []string{"STATSD_HOST", "STATSD_PORT"} {
			if _, ok := get(name); ok {
				*unsupported = append(*unsupported, name+statsdOnlyWithUse)
			}
		}
	}
	if v, ok := get("EXTRA_TAGS"); ok {
		o.StatsdTags = v
	}
	if v, ok := get("STATS_FLUSH_INTERVAL"); ok && v != "" {
		d, err := parseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("STATS_FLUSH_INTERVAL=%q: want a positive duration such as 10s", v))
		} else {
			o.StatsdFlushInterval = d
		}
	}
	return errors.Join(errs...)
}

// legacyXDS maps the xDS client TLS file variables, which count only with
// CONFIG_GRPC_XDS_SERVER_USE_TLS=true (--xds-tls), as in
// envoyproxy/ratelimit; the other CONFIG_GRPC_XDS_* and XDS_CLIENT_*
// variables are plain table mappings (settings, applyLegacyTable).
func legacyXDS(o *Options, get func(string) (string, bool)) {
	if !o.XDSTLS {
		return
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &o.XDSTLSCert},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &o.XDSTLSKey},
		{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &o.XDSTLSCA},
		{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", &o.XDSTLSSAN},
	} {
		if v, ok := get(f.name); ok && v != "" {
			*f.dst = v
		}
	}
}

// legacyRedis maps REDIS_TYPE, REDIS_URL, REDIS_SOCKET_TYPE, REDIS_AUTH and
// REDIS_TLS. envoyproxy/ratelimit's REDIS_URL is not a URL: single mode
// takes host:port or a unix socket path, cluster mode "h:p,h:p", sentinel
// mode "master,h:p,h:p". A value that already is a redis:// or rediss://
// URL is taken as is.
func legacyRedis(o *Options, typ, raw string, urlSet bool, lookup func(string) (string, bool)) error {
	get := func(name string) string { v, _ := lookup(name); return strings.TrimSpace(v) }
	auth := get("REDIS_AUTH")
	useTLS := false
	if v := get("REDIS_TLS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("REDIS_TLS=%q: %w", v, err)
		}
		useTLS = b
	}
	scheme := "redis"
	if useTLS {
		scheme = "rediss"
	}
	build := func(host string) string {
		u := url.URL{Scheme: scheme, Host: host}
		if auth != "" {
			if user, pass, ok := strings.Cut(auth, ":"); ok {
				u.User = url.UserPassword(user, pass)
			} else {
				u.User = url.UserPassword("", auth)
			}
		}
		return u.String()
	}
	if !urlSet {
		raw = "/var/run/nutcracker/ratelimit.sock"
	}
	switch strings.ToLower(typ) {
	case "", "single":
		o.Redis.Mode = "standalone"
		switch {
		case strings.Contains(raw, "://"):
			o.Redis.URL = raw
		case strings.HasPrefix(raw, "/") || (get("REDIS_SOCKET_TYPE") != "tcp" && !strings.Contains(raw, ":")):
			u := url.URL{Scheme: "unix", Path: raw}
			if auth != "" {
				if user, pass, ok := strings.Cut(auth, ":"); ok {
					u.User = url.UserPassword(user, pass)
				} else {
					u.User = url.UserPassword("", auth)
				}
			}
			o.Redis.URL = u.String()
		case strings.ContainsAny(raw, "@/?#%"):
			// host:port has none of these; a value with user info (a
			// password) or a path is named, never quoted.
			return errors.New("REDIS_URL must be host:port, a unix socket path or a redis:// URL; credentials go in REDIS_AUTH (its value is not shown: it may hold a credential)")
		default:
			o.Redis.URL = build(raw)
		}
	case "cluster":
		o.Redis.Mode = "cluster"
		o.Redis.Addrs = splitList(raw)
		if len(o.Redis.Addrs) == 0 {
			return errors.New("REDIS_TYPE=cluster: REDIS_URL must list nodes as host:port,host:port")
		}
		o.Redis.URL = build(o.Redis.Addrs[0])
	case "sentinel":
		parts := splitList(raw)
		if len(parts) < 2 {
			return errors.New("REDIS_TYPE=sentinel: REDIS_URL must be master,host:port[,host:port...] (its value is not shown: it may hold a credential)")
		}
		o.Redis.Mode = "sentinel"
		o.Redis.MasterName = parts[0]
		o.Redis.Addrs = parts[1:]
		o.Redis.URL = build(parts[1])
	default:
		return fmt.Errorf("REDIS_TYPE=%q: want single, cluster or sentinel", typ)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
