package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// redisOptions maps the --redis-* flags onto redis.Options (not yet
// validated: redis.New does, and Options.Validate checks the tuning flags
// first so that their errors name the flag).
func redisOptions(o Options) redis.Options {
	ro := redis.DefaultOptions()
	ro.URL = o.RedisURL
	ro.PasswordFile = o.RedisPasswordFile
	ro.Mode = redis.Mode(o.RedisMode)
	ro.Addrs = o.RedisAddrs
	ro.MasterName = o.RedisMaster
	ro.Timeout = o.RedisTimeout
	ro.MaxWait = o.RedisMaxWait
	ro.DeadlineMargin = o.RedisDeadlineMargin
	ro.WaitReplicas = o.RedisWaitReplicas
	ro.ProbeKey = o.KeyPrefix + redis.DefaultProbeKey
	if o.RedisPoolSize > 0 {
		ro.PoolSize = o.RedisPoolSize
	}
	ro.DialTimeout = o.RedisDialTimeout
	// Documented as "at most the pool size": the default 2 stays valid
	// with --redis-pool-size=1.
	ro.MinIdleConns = min(o.RedisMinIdleConns, ro.PoolSize)
	ro.Pipelines = o.RedisPipelines
	ro.HealthInterval = o.RedisHealthInterval
	ro.Breaker = redis.BreakerOptions{
		Failures:     o.RedisBreakerFailures,
		FailFor:      o.RedisBreakerFailFor,
		Window:       o.RedisBreakerWindow,
		MinCalls:     o.RedisBreakerMinCalls,
		FailureRatio: o.RedisBreakerFailureRatio,
		OpenFor:      o.RedisBreakerOpenFor,
		Probes:       o.RedisBreakerProbes,
		Disabled:     !o.RedisBreaker,
	}
	ro.LocalCacheSize = o.LocalCacheSize
	ro.TLSCAFile, ro.TLSCertFile, ro.TLSKeyFile = o.RedisTLSCA, o.RedisTLSCert, o.RedisTLSKey
	ro.TLSSkipVerify = o.RedisTLSSkipVerify
	ro.TLS = o.RedisTLSCA != "" || o.RedisTLSCert != "" || o.RedisTLSSkipVerify
	if o.RedisSentinelAuth != "" {
		if u, p, ok := strings.Cut(o.RedisSentinelAuth, ":"); ok {
			ro.SentinelUsername, ro.SentinelPassword = u, p
		} else {
			ro.SentinelPassword = o.RedisSentinelAuth
		}
	}
	return ro
}

// validateRedisTuning checks the Redis pool, batching, health and breaker
// flags with the ranges of redis.Options.Validate and
// redis.BreakerOptions.Validate, naming the flag. Like --redis-timeout they
// are checked whatever the backend. The breaker's own settings are not
// checked with --redis-breaker=false (the store ignores them then).
func (o Options) validateRedisTuning() error {
	var errs []error
	bad := func(flag string, v any, want string) {
		errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, want))
	}
	if o.RedisDialTimeout <= 0 {
		bad("redis-dial-timeout", o.RedisDialTimeout, "must be > 0")
	}
	if o.RedisMaxWait <= 0 {
		bad("redis-max-wait", o.RedisMaxWait, "must be > 0")
	}
	if o.RedisDeadlineMargin < 0 {
		bad("redis-deadline-margin", o.RedisDeadlineMargin, "must be >= 0")
	}
	if o.RedisWaitReplicas < 0 {
		bad("redis-wait-replicas", o.RedisWaitReplicas, "must be >= 0 (0 waits for none)")
	}
	if o.RedisWarmup < 0 {
		bad("redis-warmup", o.RedisWarmup, "must be >= 0 (0: no warm-up)")
	}
	if o.RedisMinIdleConns < 0 {
		bad("redis-min-idle-conns", o.RedisMinIdleConns, "must be >= 0")
	}
	if o.RedisPipelines < 0 {
		bad("redis-pipelines", o.RedisPipelines, "must be >= 0 (0 = the store's default)")
	}
	if o.RedisHealthInterval < 0 {
		bad("redis-health-interval", o.RedisHealthInterval, "must be >= 0 (0 disables the probe)")
	}
	if !o.RedisBreaker {
		return errors.Join(errs...)
	}
	if o.RedisBreakerFailures < 1 {
		bad("redis-breaker-failures", o.RedisBreakerFailures, "must be >= 1")
	}
	if o.RedisBreakerFailFor < 0 {
		bad("redis-breaker-fail-for", o.RedisBreakerFailFor, "must be >= 0")
	}
	if o.RedisBreakerWindow < 10*time.Millisecond {
		bad("redis-breaker-window", o.RedisBreakerWindow, "must be >= 10ms")
	}
	if o.RedisBreakerMinCalls < 1 {
		bad("redis-breaker-min-calls", o.RedisBreakerMinCalls, "must be >= 1")
	}
	if !(o.RedisBreakerFailureRatio > 0 && o.RedisBreakerFailureRatio <= 1) {
		bad("redis-breaker-failure-ratio", o.RedisBreakerFailureRatio, "must be in (0, 1]")
	}
	if o.RedisBreakerOpenFor <= 0 {
		bad("redis-breaker-open-for", o.RedisBreakerOpenFor, "must be > 0")
	}
	if o.RedisBreakerProbes < 0 {
		bad("redis-breaker-probes", o.RedisBreakerProbes, "must be >= 0 (0 means 1)")
	}
	return errors.Join(errs...)
}
