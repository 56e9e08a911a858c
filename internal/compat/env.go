// Package compat reads envoyproxy/ratelimit's environment variables and
// decides reference mode. It knows nothing of serve's options: it turns
// the environment into flag assignments (Set) that serve applies below
// its own flags and RATELIMITD_* twins, and reference mode into the
// defaults it changes, also as flag assignments. docs/migrating.md has
// the table of variables and the rule.
package compat

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A Set assigns Value to the serve flag named Flag, as flag.FlagSet.Set
// would parse it. A list flag's Value is comma-separated.
type Set struct {
	// Flag is the flag's name without dashes ("redis-url").
	Flag string
	// Value is the flag's value as its Set parses it.
	Value string
}

// A Plain is a reference variable that sets one flag as it is: Parse
// reads the variable's value as the reference reads it and returns the
// flag's value (an error is reported as NAME="value": error).
type Plain struct {
	// Var is the reference's variable ("REDIS_TIMEOUT").
	Var string
	// Flag is the flag it sets ("redis-timeout").
	Flag string
	// Parse turns the variable's trimmed value into the flag's.
	Parse func(string) (string, error)
}

// Env is what the reference's environment says to serve.
type Env struct {
	// Sets are the flag assignments, in order (a later one wins).
	Sets []Set
	// SetBy maps a flag to the reference variable that set it, for
	// errors about the flag (Annotate); only the plain variables and
	// REDIS_URL are named.
	SetBy map[string]string
	// Warnings holds at most one line naming every set variable
	// ratelimitd cannot honour.
	Warnings []string
	// StatsdReferenceAddr is where the reference would send statsd with
	// USE_STATSD unset (its default is true): STATSD_HOST:STATSD_PORT;
	// "" when USE_STATSD, DISABLE_STATS, USE_PROMETHEUS or
	// USE_DOG_STATSD rules it out. No flag: reference mode sends there
	// unless --statsd-addr is given.
	StatsdReferenceAddr string
	// StopIncrementWhenOverLimit is STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
	// (no flag): reference mode's counting default reads it.
	StopIncrementWhenOverLimit bool
}

// Has reports whether the environment sets flag.
func (e Env) Has(flag string) bool {
	for _, s := range e.Sets {
		if s.Flag == flag {
			return true
		}
	}
	return false
}

// value is the last value the environment gives flag, or def.
func (e Env) value(flag, def string) string {
	for _, s := range e.Sets {
		if s.Flag == flag {
			def = s.Value
		}
	}
	return def
}

// ignored are reference variables that need no setting here because
// ratelimitd already behaves that way (or the variable only tunes a
// mechanism ratelimitd does not have), whatever their value.
var ignored = map[string]string{
	"RUNTIME_WATCH_ROOT":                      "config directories are always watched",
	"REDIS_SOCKET_TYPE":                       "read with REDIS_URL",
	"REDIS_PIPELINE_WINDOW":                   "no effect: one script call per request",
	"REDIS_PIPELINE_LIMIT":                    "no effect: one script call per request",
	"REDIS_CLUSTER_PIPELINE_PARALLELISM":      "no effect: one script call per request",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR":            "no effect",
	"EXPIRATION_JITTER_MAX_SECONDS":           "no effect: keys expire exactly when their state is full again",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "always: health is NOT_SERVING until the first good config",
	"FORCE_START_WITHOUT_INITIAL_CONFIG":      "always: listeners start at once, health NOT_SERVING until the first good config (from files or xDS)",
	"PROMETHEUS_PATH":                         "checked in metrics",
}

// unsupported lists variables whose meaning has no ratelimitd
// equivalent; any that is set is named in the one startup warning.
var unsupported = []string{
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

// unsupportedWarning begins the one startup warning naming the variables
// ratelimitd cannot honour (a comma-separated list follows).
const unsupportedWarning = "envoyproxy/ratelimit environment variables set but not supported by ratelimitd (ignored; see docs/migrating.md): "

// statsdOnlyWithUse follows STATSD_HOST or STATSD_PORT in that warning
// when USE_STATSD is unset (reference mode honours them, see
// ReferenceWarnings).
const statsdOnlyWithUse = " (statsd is sent only with USE_STATSD=true or --statsd-addr)"

// CacheEntryBytes converts LOCAL_CACHE_SIZE_IN_BYTES (a freecache size)
// into --local-cache-size entries: one entry per this many bytes.
const CacheEntryBytes = 128

// ReadEnv maps the reference's variables onto serve's flags: the plain
// ones first, then those with rules of their own. value returns a flag's
// value before the environment (its default). The error joins one line
// per set variable whose value is malformed or that selects something
// ratelimitd refuses to imitate silently (MEMCACHE_TLS=true, a
// CONFIG_TYPE other than FILE and GRPC_XDS_SOTW); the Env returned with
// it holds what was read.
func ReadEnv(lookup func(string) (string, bool), plain []Plain, value func(flag string) string) (Env, error) {
	r := &reader{lookup: lookup, value: value}
	// The plain variables first: the rules below may read them
	// (CONFIG_GRPC_XDS_SERVER_USE_TLS).
	for _, p := range plain {
		v, ok := r.get(p.Var)
		if !ok || v == "" {
			continue
		}
		fv, err := p.Parse(v)
		if err != nil {
			r.errs = append(r.errs, fmt.Errorf("%s=%q: %w", p.Var, v, err))
			continue
		}
		r.set(p.Flag, fv)
		r.setBy(p.Flag, p.Var)
	}
	r.listeners()
	r.config()
	r.backend()
	r.answers()
	r.metrics()
	for _, name := range unsupported {
		_, ok := lookup(name)
		r.unsupportedIf(name, ok)
	}
	if len(r.unsupported) > 0 {
		r.env.Warnings = append(r.env.Warnings, unsupportedWarning+strings.Join(r.unsupported, ", "))
	}
	// REDIS_URL sets --redis-url and --redis-addrs: an error about them
	// names the variable, never its value.
	if _, ok := lookup("REDIS_URL"); ok {
		for _, f := range []string{"redis-url", "redis-addrs"} {
			if _, ok := r.env.SetBy[f]; !ok {
				r.setBy(f, "REDIS_URL")
			}
		}
	}
	return r.env, errors.Join(r.errs...)
}

// reader is one reading of the reference's variables.
type reader struct {
	lookup      func(string) (string, bool)
	value       func(string) string
	env         Env
	errs        []error
	unsupported []string
}

// get is lookup with the value trimmed.
func (r *reader) get(name string) (string, bool) {
	v, ok := r.lookup(name)
	return strings.TrimSpace(v), ok
}

func (r *reader) set(flag, value string) {
	r.env.Sets = append(r.env.Sets, Set{flag, value})
}

func (r *reader) setBy(flag, name string) {
	if r.env.SetBy == nil {
		r.env.SetBy = map[string]string{}
	}
	r.env.SetBy[flag] = name
}

// boolVar reads name when it is set and not empty; a malformed value is
// an error (ok false).
func (r *reader) boolVar(name string) (b, ok bool) {
	v, set := r.get(name)
	if !set || v == "" {
		return false, false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: %w", name, v, err))
		return false, false
	}
	return b, true
}

// unsupportedIf names name in the warning when cond holds.
func (r *reader) unsupportedIf(name string, cond bool) {
	if cond {
		r.unsupported = append(r.unsupported, name)
	}
}

// listeners maps HOST/PORT, GRPC_HOST/GRPC_PORT and DEBUG_HOST/DEBUG_PORT
// onto the host and port of the listener's default address.
func (r *reader) listeners() {
	addr := func(hostVar, portVar, flag string) {
		h, hok := r.get(hostVar)
		p, pok := r.get(portVar)
		if !hok && !pok {
			return
		}
		cur := r.value(flag)
		host, port, err := net.SplitHostPort(cur)
		if err != nil {
			host, port = "", cur
		}
		if hok {
			host = h
		}
		if pok {
			if _, err := strconv.ParseUint(p, 10, 16); err != nil {
				r.errs = append(r.errs, fmt.Errorf("%s=%q: not a port number", portVar, p))
				return
			}
			port = p
		}
		r.set(flag, net.JoinHostPort(host, port))
	}
	addr("GRPC_HOST", "GRPC_PORT", "grpc-addr")
	addr("HOST", "PORT", "http-addr")
	addr("DEBUG_HOST", "DEBUG_PORT", "debug-addr")
}

// config maps the config location (ConfigDir), CONFIG_TYPE, the xDS TLS
// files and TRACING_EXPORTER_PROTOCOL.
func (r *reader) config() {
	if dir, ok := ConfigDir(r.get); ok {
		r.set("config", dir)
	}
	// Tracing: OTLP over gRPC only (TRACING_EXPORTER_PROTOCOL=http is not).
	if v, ok := r.get("TRACING_EXPORTER_PROTOCOL"); ok && !strings.EqualFold(v, "grpc") {
		r.unsupportedIf("TRACING_EXPORTER_PROTOCOL="+v+" (only grpc)", true)
	}
	if v, ok := r.get("CONFIG_TYPE"); ok && v != "" {
		switch strings.ToUpper(v) {
		case "FILE":
			r.set("config-source", "file")
		case "GRPC_XDS_SOTW":
			r.set("config-source", "xds")
		default:
			r.errs = append(r.errs, fmt.Errorf("CONFIG_TYPE=%q: want FILE (config files) or GRPC_XDS_SOTW (xDS)", v))
		}
	}
	// The xDS client TLS files count only with
	// CONFIG_GRPC_XDS_SERVER_USE_TLS=true (--xds-tls), as in the reference.
	if tls, _ := strconv.ParseBool(r.env.value("xds-tls", r.value("xds-tls"))); !tls {
		return
	}
	for _, f := range []struct{ name, flag string }{
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds-tls-cert"},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds-tls-key"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds-tls-ca"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds-tls-san"},
	} {
		if v, ok := r.get(f.name); ok && v != "" {
			r.set(f.flag, v)
		}
	}
}

// ConfigDir is the reference's config directory,
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY (defaults
// /srv/runtime_data/current, "" and config); ok is false when none of the
// three is set. get returns a variable's trimmed value.
func ConfigDir(get func(string) (string, bool)) (dir string, ok bool) {
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

// backend maps BACKEND_TYPE, the Redis location (redisSets),
// MEMCACHE_TLS, LOCAL_CACHE_SIZE_IN_BYTES and CACHE_KEY_PREFIX.
func (r *reader) backend() {
	redisType, typeSet := r.get("REDIS_TYPE")
	redisURL, urlSet := r.get("REDIS_URL")
	if v, ok := r.get("BACKEND_TYPE"); ok {
		switch strings.ToLower(v) {
		case "redis", "":
			r.set("backend", "redis")
		case "memcache":
			r.set("backend", "memcache")
		default:
			r.errs = append(r.errs, fmt.Errorf("BACKEND_TYPE=%q: want redis or memcache", v))
		}
	} else if typeSet || urlSet {
		// The reference's default backend is Redis.
		r.set("backend", "redis")
	}
	if typeSet || urlSet {
		sets, err := redisSets(redisType, redisURL, urlSet, r.lookup)
		r.env.Sets = append(r.env.Sets, sets...)
		if err != nil {
			r.errs = append(r.errs, err)
		}
	}
	// MEMCACHE_HOST_PORT and MEMCACHE_SRV are plain; both set is refused
	// by serve's validation, as the reference refuses it at startup.
	if v, ok := r.get("MEMCACHE_TLS"); ok && v != "" {
		b, err := strconv.ParseBool(v)
		switch {
		case err != nil:
			r.errs = append(r.errs, fmt.Errorf("MEMCACHE_TLS=%q: %w", v, err))
		case b:
			// Connecting in plaintext to a TLS port would fail every call.
			r.errs = append(r.errs, errors.New("MEMCACHE_TLS=true: TLS to memcached is not supported; use a TLS-terminating sidecar or the redis backend"))
		}
	}
	if v, ok := r.get("LOCAL_CACHE_SIZE_IN_BYTES"); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			r.errs = append(r.errs, fmt.Errorf("LOCAL_CACHE_SIZE_IN_BYTES=%q: not a size in bytes", v))
		} else {
			entries := 0
			if n > 0 {
				entries = max(1, n/CacheEntryBytes)
			}
			r.set("local-cache-size", strconv.Itoa(entries))
		}
	}
	if v, ok := r.get("CACHE_KEY_PREFIX"); ok {
		r.set("key-prefix", v)
	}
}

// answers maps the response headers, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
// and LOG_LEVEL.
func (r *reader) answers() {
	// LIMIT_RESPONSE_HEADERS_ENABLED: the reference's three headers, or
	// none; their names are LIMIT_*_HEADER's (reference mode gives them
	// the reference's defaults when unset).
	if on, ok := r.boolVar("LIMIT_RESPONSE_HEADERS_ENABLED"); ok {
		r.set("headers", map[bool]string{true: "legacy", false: "none"}[on])
	}
	for _, h := range []struct{ name, flag string }{
		{"LIMIT_LIMIT_HEADER", "legacy-limit-header"},
		{"LIMIT_REMAINING_HEADER", "legacy-remaining-header"},
		{"LIMIT_RESET_HEADER", "legacy-reset-header"},
	} {
		if v, ok := r.get(h.name); ok && v != "" {
			r.set(h.flag, v)
		}
	}
	if stop, ok := r.boolVar("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"); ok {
		r.env.StopIncrementWhenOverLimit = stop
	}
	// Logging (logrus level names).
	if v, ok := r.get("LOG_LEVEL"); ok && v != "" {
		level := ""
		switch strings.ToLower(v) {
		case "trace", "debug":
			level = "debug"
		case "info":
			level = "info"
		case "warn", "warning":
			level = "warn"
		case "error", "fatal", "panic":
			level = "error"
		default:
			r.errs = append(r.errs, fmt.Errorf("LOG_LEVEL=%q: unknown level", v))
		}
		if level != "" {
			r.set("log-level", level)
		}
	}
}

// metrics maps statsd (statsd, STATSD_PROTOCOL), Prometheus
// (USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH) and the gRPC server
// TLS variables.
func (r *reader) metrics() {
	r.statsd()
	if v, ok := r.get("STATSD_PROTOCOL"); ok && v != "" && !strings.EqualFold(v, "udp") {
		r.unsupportedIf("STATSD_PROTOCOL="+v+" (statsd is sent over UDP)", r.env.Has("statsd-addr") || r.env.StatsdReferenceAddr != "")
	}
	if v, ok := r.get("USE_PROMETHEUS"); ok && v != "" {
		// A malformed value is reported by statsd.
		if b, err := strconv.ParseBool(v); err == nil && b {
			addr := ":9090"
			if a, ok := r.get("PROMETHEUS_ADDR"); ok && a != "" {
				addr = a
			}
			r.set("metrics-addr", addr)
		}
	}
	if v, ok := r.get("PROMETHEUS_PATH"); ok && v != "" && v != "/metrics" {
		r.unsupported = append(r.unsupported, "PROMETHEUS_PATH")
	}

	// gRPC server TLS.
	if useTLS, _ := r.boolVar("GRPC_SERVER_USE_TLS"); useTLS {
		var files [4]string
		for i, f := range []struct{ name, flag string }{
			{"GRPC_SERVER_TLS_CERT", "grpc-tls-cert"},
			{"GRPC_SERVER_TLS_KEY", "grpc-tls-key"},
			{"GRPC_CLIENT_TLS_CACERT", "grpc-tls-client-ca"},
			{"GRPC_CLIENT_TLS_SAN", "grpc-tls-client-san"},
		} {
			files[i], _ = r.get(f.name)
			r.set(f.flag, files[i])
		}
		if files[0] == "" || files[1] == "" {
			// Serving plaintext instead would silently drop the TLS asked
			// for; the reference fails to load an empty path too.
			r.errs = append(r.errs, errors.New("GRPC_SERVER_USE_TLS=true: needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"))
		}
	}
}

// statsd maps USE_STATSD, STATSD_HOST, STATSD_PORT, STATS_FLUSH_INTERVAL,
// EXTRA_TAGS (--statsd-tags) and DISABLE_STATS. Only USE_STATSD=true set
// explicitly gives --statsd-addr; where the reference would send with
// USE_STATSD unset (its default is true) is Env.StatsdReferenceAddr, and
// STATSD_HOST or STATSD_PORT set without it is named in the unsupported
// warning.
func (r *reader) statsd() {
	use, useSet := false, false
	if v, ok := r.get("USE_STATSD"); ok && v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			r.errs = append(r.errs, fmt.Errorf("USE_STATSD=%q: %w", v, err))
		}
		use, useSet = b, true
	}
	// Each read once, whatever the others say, so that every malformed
	// value is reported.
	disable, _ := r.boolVar("DISABLE_STATS")
	prometheus, _ := r.boolVar("USE_PROMETHEUS")
	dogStatsd, _ := r.boolVar("USE_DOG_STATSD")
	if disable {
		use, useSet = false, true
	}
	host, port := "localhost", "8125"
	if v, ok := r.get("STATSD_HOST"); ok && v != "" {
		host = v
	}
	if v, ok := r.get("STATSD_PORT"); ok && v != "" {
		if _, err := strconv.ParseUint(v, 10, 16); err != nil {
			r.errs = append(r.errs, fmt.Errorf("STATSD_PORT=%q: not a port number", v))
		}
		port = v
	}
	addr := net.JoinHostPort(host, port)
	switch {
	case useSet && use:
		r.set("statsd-addr", addr)
	case !useSet && !prometheus && !dogStatsd:
		r.env.StatsdReferenceAddr = addr
		for _, name := range []string{"STATSD_HOST", "STATSD_PORT"} {
			if _, ok := r.get(name); ok {
				r.unsupported = append(r.unsupported, name+statsdOnlyWithUse)
			}
		}
	}
	if v, ok := r.get("EXTRA_TAGS"); ok {
		r.set("statsd-tags", v)
	}
	if v, ok := r.get("STATS_FLUSH_INTERVAL"); ok && v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			r.errs = append(r.errs, fmt.Errorf("STATS_FLUSH_INTERVAL=%q: want a positive duration such as 10s", v))
		} else {
			r.set("statsd-flush-interval", d.String())
		}
	}
}
