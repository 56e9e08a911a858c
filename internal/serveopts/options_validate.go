// Validation of the command's own Options rules; the packages' rules are
// checked through validateOwners (owners.go).

package serveopts

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/compat"
	"github.com/ratelimitd/ratelimitd/internal/secrets"
)

// OneOf is nil when v is one of allowed, else the error
// "--name=\"v\": want one of a, b, c" (for serve's and replay's flags).
func OneOf(name, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("--%s=%q: want one of %s", name, v, strings.Join(allowed, ", "))
}

// checkAddr refuses a --name that is no host:port ("" passes when optional).
// The port must be given and be a port number (0 to 65535) or a service
// name: net.Listen would take ":" as a random port on every interface, and
// an out-of-range port would fail only when the listener opens.
func checkAddr(name, v string, optional bool) error {
	if v == "" && optional {
		return nil
	}
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("--%s=%q: %w", name, v, err)
	}
	if port == "" {
		return fmt.Errorf("--%s=%q: missing port (is the variable that sets it empty?)", name, v)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("--%s=%q: bad port %q: want 0 to 65535", name, v, port)
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
	add(OneOf("config-source", o.ConfigSource, "file", "xds"))
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
	if _, err := ParseStatsdTags(o.StatsdTags); err != nil {
		add(err)
	}
	if o.StatsdFlushInterval <= 0 {
		add(fmt.Errorf("--statsd-flush-interval=%s: must be > 0", o.StatsdFlushInterval))
	}
}

// validateSpellings checks the flags that take one of a set of words, and the legacy header names.
func (o Options) validateSpellings(add func(error)) {
	add(OneOf("backend", o.Backend, "memory", "redis", "memcache"))
	add(OneOf("redis-mode", string(o.Redis.Mode), "standalone", "cluster", "sentinel"))
	add(OneOf("log-level", o.LogLevel, "debug", "info", "warn", "error"))
	add(OneOf("log-format", o.LogFormat, "text", "json"))
	add(OneOf("key-values", o.KeyValues, "hash", "clear"))
	add(OneOf("headers", o.Headers, "ietf", "legacy", "both", "none"))
	add(OneOf("counting", o.Counting, "all_or_nothing", "always_charge"))
	add(OneOf("mode", o.Mode, compat.ModeAuto, compat.ModeReference, compat.ModeNative))
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
	// here (the flag's default is spelled out instead), with the rest of
	// the flag's range so that the message states its whole rule; the
	// packages' own ranges are theirs (validateOwners, at the end).
	notNegative(add, "redis-pool-size", o.Redis.PoolSize, "the store's default")
	if o.Redis.MinIdleConns < 0 {
		// redisOptions caps it at the pool size.
		add(fmt.Errorf("--redis-min-idle-conns=%d: must be >= 0 (more than the pool size is capped to it)", o.Redis.MinIdleConns))
	}
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
	// Where the flag's 0 would be the package's default, the flag's
	// whole rule is stated here (validateOwners then skips the flag).
	if !(o.Service.NearLimitRatio > 0 && o.Service.NearLimitRatio <= 1) {
		add(fmt.Errorf("--near-limit-ratio=%v: must be in (0, 1]", o.Service.NearLimitRatio))
	}
	if o.RetryJitter < 0 {
		add(fmt.Errorf("--retry-jitter=%s: must be >= 0", o.RetryJitter))
	}
	if o.Service.FailClosedRetryAfter <= 0 {
		add(fmt.Errorf("--fail-closed-retry-after=%s: must be > 0", o.Service.FailClosedRetryAfter))
	}
	if o.Service.DetailedMetricCap == 0 {
		add(errors.New("--detailed-metric-cap=0: want > 0, or negative to disable detailed labels"))
	}
	o.validateDurable(add)
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
		if _, err := secrets.ReadFile("debug-token-file", o.DebugTokenFile); err != nil {
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

// notNegative adds "--<flag>=<v>: must be >= 0 (0 = <zero>)" when v is
// negative; zero says what the flag's 0 means.
func notNegative[T int | int64 | time.Duration](add func(error), flag string, v T, zero string) {
	if v < 0 {
		add(fmt.Errorf("--%s=%v: must be >= 0 (0 = %s)", flag, v, zero))
	}
}

// validateDurable checks the --durable-* flags: with --durable-url, the
// store's own rules (postgres.Options.Validate, whose messages never hold
// the password) and a positive connect timeout; without it, no password
// file.
func (o Options) validateDurable(add func(error)) {
	if o.DurableURL == "" {
		if o.DurablePasswordFile != "" {
			add(errors.New("--durable-password-file needs --durable-url"))
		}
		return
	}
	for _, e := range leafErrors(DurableOptions(o, "").Validate()) {
		add(fmt.Errorf("--durable-*: %w", e))
	}
	if o.DurableConnect <= 0 {
		add(fmt.Errorf("--durable-connect-timeout=%s: must be > 0", o.DurableConnect))
	}
}
