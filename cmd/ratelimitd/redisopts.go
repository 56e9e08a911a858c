package main

import (
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// redisOptions maps the --redis-* flags onto redis.Options (validated by
// redis.Options.Validate, through Options.validateOwners, and by
// redis.New).
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
	ro.WindowKeys = o.RedisWindowKeys
	ro.ProbeKey = o.KeyPrefix + redis.DefaultProbeKey
	ro.CreditChannel = o.KeyPrefix + redis.DefaultCreditChannel
	ro.CacheUncharged = o.ReferenceCounting
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
	// Reference mode counts always_charge fixed windows as the reference
	// does: INCRBY and PEXPIRE, no script.
	ro.NativeCounting = o.Reference
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
