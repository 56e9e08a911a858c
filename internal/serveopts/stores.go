package serveopts

import (
	"errors"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/events"
	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// closingStore is a store that holds connections or goroutines until
// Close.
type closingStore interface {
	service.Store
	Close() error
}

// NewStore builds the configured backend store and the in-process fallback
// for failure_mode: local (nil for the memory backend). Both in-memory
// stores hold at most --memory-max-keys keys; beyond that a request that
// needs a new key drops an expired key or, when none has expired, the
// store decides the new key with its sketch or denies it (memory.Store,
// "Full store"), so a flood of keys switches no limit off.
// ev, when not nil, receives the circuit breaker's transitions and
// reports (Redis, and memcached with one server).
func NewStore(o Options, ev *events.Events) (service.Store, service.Store, func() error, error) {
	mem := func() (*memory.Store, error) { return memory.New(memory.Options{MaxKeys: o.MemoryMaxKeys}) }
	// withFallback pairs a network store built without error with its
	// in-process fallback, closing the store when the fallback fails.
	withFallback := func(st closingStore, err error) (service.Store, service.Store, func() error, error) {
		if err != nil {
			return nil, nil, nil, err
		}
		fb, err := mem()
		if err != nil {
			_ = st.Close()
			return nil, nil, nil, err
		}
		return st, fb, func() error { return errors.Join(st.Close(), fb.Close()) }, nil
	}
	switch o.Backend {
	case "redis":
		ro := redisOptions(o)
		if ev != nil {
			ro.Breaker.OnTransition, ro.Breaker.OnReport = ev.OnCircuit, ev.OnReport
		}
		return withFallback(redis.New(ro))
	case "memcache":
		mo := memcacheOptions(o)
		if ev != nil {
			mo.OnCircuit, mo.OnCircuitReport = ev.OnCircuit, ev.OnReport
		}
		return withFallback(memcache.New(mo))
	default:
		ms, err := mem()
		if err != nil {
			return nil, nil, nil, err
		}
		return ms, nil, ms.Close, nil
	}
}

// BackendTarget are the attributes of the startup log line naming the
// store and where it points, with any password redacted.
func BackendTarget(o Options) []any {
	if o.Backend == "memcache" {
		if o.Memcache.SRV != "" {
			return []any{"type", "memcache", "srv", o.Memcache.SRV, "srv_refresh", o.Memcache.SRVRefresh.String(), "timeout", o.Memcache.Timeout.String()}
		}
		return []any{"type", "memcache", "addrs", secrets.Redact(secrets.Address, strings.Join(o.Memcache.Addrs, ",")), "timeout", o.Memcache.Timeout.String()}
	}
	if o.Backend != "redis" {
		return []any{"type", o.Backend}
	}
	attrs := []any{"type", "redis", "mode", string(o.Redis.Mode)}
	switch o.Redis.Mode {
	case redis.Sentinel:
		// The URL's host is not dialed in Sentinel mode (it gives only the
		// credentials, database and TLS): name the master and the sentinels.
		attrs = append(attrs, "master", o.Redis.MasterName, "sentinels", secrets.Redact(secrets.Address, strings.Join(o.Redis.Addrs, ",")), "tls", strings.HasPrefix(o.Redis.URL, "rediss://"))
	case redis.Cluster:
		attrs = append(attrs, "addrs", secrets.Redact(secrets.Address, strings.Join(o.Redis.Addrs, ",")), "tls", strings.HasPrefix(o.Redis.URL, "rediss://"))
	default:
		attrs = append(attrs, "url", redis.RedactURL(o.Redis.URL))
		if len(o.Redis.Addrs) > 0 {
			attrs = append(attrs, "addrs", secrets.Redact(secrets.Address, strings.Join(o.Redis.Addrs, ",")))
		}
	}
	if o.Redis.PasswordFile != "" {
		attrs = append(attrs, "password_file", o.Redis.PasswordFile)
	}
	return attrs
}

// DurableOptions maps the --durable-* flags onto postgres.Options
// (validated by postgres.New); password is --durable-password-file's
// content ("" without it).
func DurableOptions(o Options, password string) postgres.Options {
	po := postgres.DefaultOptions()
	po.URL = o.DurableURL
	po.Password = password
	po.Timeout = o.DurableTimeout
	po.MaxConns = int32(min(o.DurableMaxConns, 1<<30))
	po.ConnectTimeout = o.DurableConnect
	po.AsyncCommit = o.DurableAsyncCommit
	return po
}
