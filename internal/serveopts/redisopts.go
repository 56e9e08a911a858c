package serveopts

import (
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// redisOptions are the redis.Options the --redis-* flags set (o.Redis),
// with what the command derives: keys under --key-prefix, the pool's
// default for 0, idle connections at most the pool, TLS on when a TLS
// flag is given, the sentinel credentials and the
// reference's counting.
func redisOptions(o Options) redis.Options {
	ro := o.Redis
	ro.ProbeKey = o.KeyPrefix + redis.DefaultProbeKey
	ro.CreditChannel = o.KeyPrefix + redis.DefaultCreditChannel
	ro.CacheUncharged = o.ReferenceCounting
	if ro.PoolSize <= 0 {
		ro.PoolSize = redis.DefaultPoolSize
	}
	// Documented as "at most the pool size": the default 2 stays valid
	// with --redis-pool-size=1.
	ro.MinIdleConns = min(ro.MinIdleConns, ro.PoolSize)
	// Reference mode counts always_charge fixed windows as the reference
	// does: INCRBY and PEXPIRE, no script.
	ro.NativeCounting = o.Reference
	ro.TLS = ro.TLSCAFile != "" || ro.TLSCertFile != "" || ro.TLSSkipVerify || ro.TLSSkipHostname
	if o.RedisSentinelAuth != "" {
		if u, p, ok := strings.Cut(o.RedisSentinelAuth, ":"); ok {
			ro.SentinelUsername, ro.SentinelPassword = u, p
		} else {
			ro.SentinelPassword = o.RedisSentinelAuth
		}
	}
	return ro
}
