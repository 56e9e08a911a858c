// Package redis is the Redis store of ratelimitd: one Lua script decides all
// hits of a request atomically with the server's TIME, on standalone,
// Sentinel or Cluster deployments.
package redis

import "time"

// Mode is the Redis deployment topology.
type Mode string

const (
	Standalone Mode = "standalone"
	Cluster    Mode = "cluster"  // Addrs are seed nodes
	Sentinel   Mode = "sentinel" // Addrs are sentinels, MasterName the monitored master
)

// Options configure a Store. The zero value is not valid; start from
// DefaultOptions. (Skeleton: the Redis helpers complete and own this file.)
type Options struct {
	// URL is redis:// or rediss:// (TLS) with optional user:password@ and
	// /db. Standalone mode dials its host; other modes take credentials,
	// TLS and DB from it.
	URL        string
	Mode       Mode
	Addrs      []string
	MasterName string
	// Timeout bounds every operation (dial, read, write); it must stay well
	// under Envoy's 20 ms filter timeout.
	Timeout  time.Duration
	PoolSize int
	// KeyPrefix is prepended by the policy package already; kept here only
	// for documentation of what ends up in Redis.
	// LocalCacheSize bounds the local over-limit cache (entries); 0 disables it.
	LocalCacheSize int
	// Now, when set (tests only), pins the script's clock instead of the
	// server's TIME.
	Now func() time.Time
}
