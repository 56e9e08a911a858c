package serveopts

import (
	"flag"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/rlqs"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ratelimitd/ratelimitd/internal/compat"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/lease"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestParseServeDefaults: with no flag and no environment, Parse gives
// Defaults, no warning, and the defaults docs/flags.md and the README
// state.
func TestParseServeDefaults(t *testing.T) {
	o, warnings, err := Parse(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings = %q, want none", warnings)
	}
	want := Defaults()
	want.Redis.LocalCacheSize = 0 // on by default with the Redis backend only
	if diff := cmp.Diff(want, o, ignoreFromEnv); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	// The defaults docs/flags.md and the README promise.
	for _, c := range []struct{ got, want string }{
		{strings.Join(o.Config, ","), "./config"},
		{o.GRPCAddr, ":8081"}, {o.HTTPAddr, ":8080"}, {o.DebugAddr, "127.0.0.1:6070"},
		{o.Backend, "memory"}, {o.Redis.URL, "redis://127.0.0.1:6379/0"}, {string(o.Redis.Mode), "standalone"},
		{o.LogLevel, "info"}, {o.LogFormat, "text"}, {o.Headers, "ietf"}, {o.KeyValues, "hash"},
	} {
		if c.got != c.want {
			t.Errorf("default %q, want %q", c.got, c.want)
		}
	}
	if o.Redis.Timeout <= 0 || o.Redis.Timeout >= 20*time.Millisecond {
		t.Errorf("redis timeout default %v, want well under Envoy's 20ms", o.Redis.Timeout)
	}
	if o.Service.ShadowMode || !o.RequestOverrides {
		t.Errorf("shadow=%v overrides=%v, want false true", o.Service.ShadowMode, o.RequestOverrides)
	}
}

// TestParseServePrecedence: a flag beats its RATELIMITD_* twin, which beats
// the reference's variable, which beats the default.
func TestParseServePrecedence(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		get  func(Options) any
		want any
	}{
		{"default", nil, nil, func(o Options) any { return o.GRPCAddr }, ":8081"},
		{"legacy", nil, []string{"GRPC_PORT", "9000"}, func(o Options) any { return o.GRPCAddr }, ":9000"},
		{"legacy host+port", nil, []string{"GRPC_HOST", "127.0.0.1", "GRPC_PORT", "9000"}, func(o Options) any { return o.GRPCAddr }, "127.0.0.1:9000"},
		{"twin beats legacy", nil, []string{"GRPC_PORT", "9000", "RATELIMITD_GRPC_ADDR", ":9100"}, func(o Options) any { return o.GRPCAddr }, ":9100"},
		{"flag beats twin", []string{"--grpc-addr", ":9200"}, []string{"GRPC_PORT", "9000", "RATELIMITD_GRPC_ADDR", ":9100"}, func(o Options) any { return o.GRPCAddr }, ":9200"},
		{"bool twin", nil, []string{"RATELIMITD_SHADOW_MODE", "true"}, func(o Options) any { return o.Service.ShadowMode }, true},
		{"bool flag beats twin", []string{"--shadow-mode=false"}, []string{"RATELIMITD_SHADOW_MODE", "true", "SHADOW_MODE", "true"}, func(o Options) any { return o.Service.ShadowMode }, false},
		{"legacy bool", nil, []string{"SHADOW_MODE", "true"}, func(o Options) any { return o.Service.ShadowMode }, true},
		{"config repeated", []string{"--config", "a", "--config", "b"}, nil, func(o Options) any { return o.Config }, []string{"a", "b"}},
		{"config twin list", nil, []string{"RATELIMITD_CONFIG", "x,y"}, func(o Options) any { return o.Config }, []string{"x", "y"}},
		{"config flag replaces twin", []string{"--config=c"}, []string{"RATELIMITD_CONFIG", "x,y"}, func(o Options) any { return o.Config }, []string{"c"}},
		{"runtime layout", nil, []string{"RUNTIME_ROOT", "/tmp/x/current", "RUNTIME_SUBDIRECTORY", "ratelimit"}, func(o Options) any { return o.Config }, []string{"/tmp/x/current/ratelimit/config"}},
		{"runtime appdir", nil, []string{"RUNTIME_ROOT", "/r", "RUNTIME_SUBDIRECTORY", "s", "RUNTIME_APPDIRECTORY", "app"}, func(o Options) any { return o.Config }, []string{"/r/s/app"}},
		{"twin beats runtime", nil, []string{"RUNTIME_ROOT", "/r", "RATELIMITD_CONFIG", "mine"}, func(o Options) any { return o.Config }, []string{"mine"}},
		{"duration twin", nil, []string{"RATELIMITD_REDIS_TIMEOUT", "3ms"}, func(o Options) any { return o.Redis.Timeout }, 3 * time.Millisecond},
		{"legacy duration", nil, []string{"REDIS_TIMEOUT", "7ms"}, func(o Options) any { return o.Redis.Timeout }, 7 * time.Millisecond},
		{"legacy headers on", nil, []string{"LIMIT_RESPONSE_HEADERS_ENABLED", "true"}, func(o Options) any { return o.Headers }, "legacy"},
		{"legacy headers off", nil, []string{"LIMIT_RESPONSE_HEADERS_ENABLED", "false"}, func(o Options) any { return o.Headers }, "none"},
		{"headers flag beats legacy", []string{"--headers=both"}, []string{"LIMIT_RESPONSE_HEADERS_ENABLED", "true"}, func(o Options) any { return o.Headers }, "both"},
		{"log level logrus", nil, []string{"LOG_LEVEL", "WARNING"}, func(o Options) any { return o.LogLevel }, "warn"},
		{"log level trace", nil, []string{"LOG_LEVEL", "trace"}, func(o Options) any { return o.LogLevel }, "debug"},
		{"log format", nil, []string{"LOG_FORMAT", "json"}, func(o Options) any { return o.LogFormat }, "json"},
		{"near limit", nil, []string{"NEAR_LIMIT_RATIO", "0.9"}, func(o Options) any { return o.Service.NearLimitRatio }, 0.9},
		{"cache bytes", nil, []string{"LOCAL_CACHE_SIZE_IN_BYTES", "1048576"}, func(o Options) any { return o.Redis.LocalCacheSize }, 1048576 / compat.CacheEntryBytes},
		{"cache on by default on redis", []string{"--backend=redis", "--redis-url=redis://127.0.0.1:6379", "--config=c"}, nil, func(o Options) any { return o.Redis.LocalCacheSize }, redis.DefaultLocalCacheSize},
		{"cache off by default on memcache", []string{"--backend=memcache", "--memcache-addrs=127.0.0.1:11211", "--config=c"}, nil, func(o Options) any { return o.Redis.LocalCacheSize }, 0},
		{"cache sized on memcache", []string{"--backend=memcache", "--memcache-addrs=127.0.0.1:11211", "--config=c", "--local-cache-size=7"}, nil, func(o Options) any { return o.Redis.LocalCacheSize }, 7},
		{"cache off by default in reference mode", nil, []string{"REDIS_URL", "127.0.0.1:6379"}, func(o Options) any { return o.Redis.LocalCacheSize }, 0},
		{"cache bytes in reference mode", nil, []string{"REDIS_URL", "127.0.0.1:6379", "LOCAL_CACHE_SIZE_IN_BYTES", "1280"}, func(o Options) any { return o.Redis.LocalCacheSize }, 10},
		{"cache flag in reference mode", []string{"--local-cache-size=5"}, []string{"REDIS_URL", "127.0.0.1:6379"}, func(o Options) any { return o.Redis.LocalCacheSize }, 5},
		{"cache bytes 0 on redis", []string{"--backend=redis", "--redis-url=redis://127.0.0.1:6379", "--config=c"}, []string{"LOCAL_CACHE_SIZE_IN_BYTES", "0"}, func(o Options) any { return o.Redis.LocalCacheSize }, 0},
		{"key prefix", nil, []string{"CACHE_KEY_PREFIX", "rl:"}, func(o Options) any { return o.KeyPrefix }, "rl:"},
		{"merge", nil, []string{"MERGE_DOMAIN_CONFIG", "true"}, func(o Options) any { return o.MergeDomains }, true},
		{"quota", nil, []string{"QUOTA_MODE", "true"}, func(o Options) any { return o.Service.QuotaMode }, true},
		{"dynamic metadata", nil, []string{"RESPONSE_DYNAMIC_METADATA", "true"}, func(o Options) any { return o.Service.DynamicMetadata }, true},
		{"dotfiles", nil, []string{"RUNTIME_IGNOREDOTFILES", "false"}, func(o Options) any { return o.IgnoreDotfiles }, false},
		{"http port", nil, []string{"PORT", "18080"}, func(o Options) any { return o.HTTPAddr }, ":18080"},
		{"debug host", nil, []string{"DEBUG_HOST", "127.0.0.1"}, func(o Options) any { return o.DebugAddr }, "127.0.0.1:6070"},
		{"prometheus", nil, []string{"USE_PROMETHEUS", "true"}, func(o Options) any { return o.MetricsAddr }, ":9090"},
		{"prometheus addr", nil, []string{"USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", "127.0.0.1:9191"}, func(o Options) any { return o.MetricsAddr }, "127.0.0.1:9191"},
		{"backend implied by REDIS_URL", nil, []string{"REDIS_URL", "127.0.0.1:6379", "REDIS_SOCKET_TYPE", "tcp"}, func(o Options) any { return o.Backend + " " + o.Redis.URL }, "redis redis://127.0.0.1:6379"},
		{"redis auth tls", nil, []string{"REDIS_URL", "r.example:6380", "REDIS_AUTH", "u:p@ss", "REDIS_TLS", "true"}, func(o Options) any { return o.Redis.URL }, "rediss://u:p%40ss@r.example:6380"},
		{"redis auth password only", nil, []string{"REDIS_URL", "r:6379", "REDIS_AUTH", "secret"}, func(o Options) any { return o.Redis.URL }, "redis://:secret@r:6379"},
		{"redis unix socket", nil, []string{"REDIS_URL", "/var/run/redis.sock"}, func(o Options) any { return o.Redis.URL }, "unix:///var/run/redis.sock"},
		{"redis cluster", nil, []string{"REDIS_TYPE", "CLUSTER", "REDIS_URL", "a:1,b:2"}, func(o Options) any {
			return []string{string(o.Redis.Mode), o.Redis.URL, strings.Join(o.Redis.Addrs, " ")}
		}, []string{"cluster", "redis://a:1", "a:1 b:2"}},
		{"redis sentinel", nil, []string{"REDIS_TYPE", "sentinel", "REDIS_URL", "mymaster,s1:26379,s2:26379"}, func(o Options) any {
			return []string{string(o.Redis.Mode), o.Redis.MasterName, strings.Join(o.Redis.Addrs, " ")}
		}, []string{"sentinel", "mymaster", "s1:26379 s2:26379"}},
		{"redis twin beats legacy", nil, []string{"REDIS_URL", "a:1", "RATELIMITD_REDIS_URL", "redis://b:2/0"}, func(o Options) any { return o.Redis.URL }, "redis://b:2/0"},
		{"backend flag beats legacy", []string{"--backend=memory"}, []string{"BACKEND_TYPE", "redis"}, func(o Options) any { return o.Backend }, "memory"},
		{"redis tls files", nil, []string{"REDIS_TLS_CACERT", "ca.pem", "REDIS_TLS_CLIENT_CERT", "c.pem", "REDIS_TLS_CLIENT_KEY", "k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"}, func(o Options) any {
			return []any{o.Redis.TLSCAFile, o.Redis.TLSCertFile, o.Redis.TLSKeyFile, o.Redis.TLSSkipHostname, o.Redis.TLSSkipVerify}
		}, []any{"ca.pem", "c.pem", "k.pem", true, false}},
		{"sentinel auth", nil, []string{"REDIS_SENTINEL_AUTH", "u:p"}, func(o Options) any { return o.RedisSentinelAuth }, "u:p"},
		{"pool size", nil, []string{"REDIS_POOL_SIZE", "42"}, func(o Options) any { return o.Redis.PoolSize }, 42},
		{"memcache legacy", nil, []string{"BACKEND_TYPE", "memcache", "MEMCACHE_HOST_PORT", "m1:11211, m2:11211", "MEMCACHE_MAX_IDLE_CONNS", "7"},
			func(o Options) any {
				return []any{o.Backend, strings.Join(o.Memcache.Addrs, " "), o.Memcache.MaxIdleConns}
			}, []any{"memcache", "m1:11211 m2:11211", 7}},
		{"memcache legacy srv", nil, []string{"BACKEND_TYPE", "memcache", "MEMCACHE_SRV", "_memcache._tcp.example.com", "MEMCACHE_SRV_REFRESH", "30s", "MEMCACHE_TLS", "false"},
			func(o Options) any { return []any{o.Backend, o.Memcache.SRV, o.Memcache.SRVRefresh} }, []any{"memcache", "_memcache._tcp.example.com", 30 * time.Second}},
		{"memcached flag spelling", []string{"--backend=memcached", "--memcache-addrs=a:1", "--memcache-timeout=5ms"}, nil,
			func(o Options) any { return []any{o.Backend, o.Memcache.Addrs, o.Memcache.Timeout} }, []any{"memcache", []string{"a:1"}, 5 * time.Millisecond}},
		{"memcache twins beat legacy", nil, []string{"BACKEND_TYPE", "memcache", "MEMCACHE_HOST_PORT", "a:1", "RATELIMITD_MEMCACHE_ADDRS", "b:2,c:3", "RATELIMITD_MEMCACHE_SRV_REFRESH", "1m"},
			func(o Options) any { return []any{o.Memcache.Addrs, o.Memcache.SRVRefresh} }, []any{[]string{"b:2", "c:3"}, time.Minute}},
		{"grpc tls", nil, []string{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "c.pem", "GRPC_SERVER_TLS_KEY", "k.pem"}, func(o Options) any { return o.GRPCTLSCert + " " + o.GRPCTLSKey }, "c.pem k.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, _, err := Parse(tt.args, env(tt.env...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, tt.get(o)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseServeErrors: each bad value or combination is refused with an
// error naming the flag, twin or reference variable that set it.
func TestParseServeErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string // regexp on the error
	}{
		{"bad backend", []string{"--backend=etcd"}, nil, `--backend="etcd"`},
		{"bad headers", []string{"--headers=x"}, nil, `--headers="x"`},
		{"bad counting", []string{"--counting=always"}, nil, `--counting="always": want one of all_or_nothing, always_charge`},
		{"bad counting twin", nil, []string{"RATELIMITD_COUNTING", "ALWAYS_CHARGE"}, `--counting="ALWAYS_CHARGE"`},
		{"bad log format", nil, []string{"RATELIMITD_LOG_FORMAT", "xml"}, `--log-format="xml"`},
		{"bad twin bool", nil, []string{"RATELIMITD_SHADOW_MODE", "maybe"}, `RATELIMITD_SHADOW_MODE="maybe"`},
		{"bad legacy bool", nil, []string{"SHADOW_MODE", "maybe"}, `SHADOW_MODE="maybe"`},
		{"bad legacy port", nil, []string{"GRPC_PORT", "http"}, `GRPC_PORT="http"`},
		{"memcache without servers", nil, []string{"BACKEND_TYPE", "memcache"}, `--backend=memcache needs --memcache-addrs or --memcache-srv`},
		{"memcache both", nil, []string{"BACKEND_TYPE", "memcache", "MEMCACHE_HOST_PORT", "a:1", "MEMCACHE_SRV", "_m._tcp.x"}, `set one, not both`},
		{"memcache tls", nil, []string{"BACKEND_TYPE", "memcache", "MEMCACHE_HOST_PORT", "a:1", "MEMCACHE_TLS", "true"}, `MEMCACHE_TLS=true: TLS to memcached is not supported`},
		{"memcache bad refresh", nil, []string{"MEMCACHE_SRV_REFRESH", "soon"}, `MEMCACHE_SRV_REFRESH="soon"`},
		{"memcache bad timeout", []string{"--backend=memcache", "--memcache-addrs=a:1", "--memcache-timeout=0"}, nil, `--memcache-timeout=0s: must be > 0`},
		{"backend type unknown", nil, []string{"BACKEND_TYPE", "etcd"}, `BACKEND_TYPE="etcd": want redis or memcache`},
		{"config type", nil, []string{"CONFIG_TYPE", "GRPC_XDS_DELTA"}, `CONFIG_TYPE="GRPC_XDS_DELTA": want FILE .* or GRPC_XDS_SOTW`},
		{"xds source", []string{"--config-source=etcd"}, nil, `--config-source="etcd"`},
		{"rlqs interval", []string{"--rlqs-interval=-1s"}, nil, `--rlqs-interval=-1s: must not be negative`},
		{"lease interval negative", []string{"--lease-interval=-1s"}, nil, `--lease-interval=-1s: must not be negative`},
		{"lease interval short", []string{"--lease-interval=100us"}, nil, `--lease-interval=100µs: must be at least 1ms \(0 means the default, 100ms\)`},
		{"lease interval env", nil, []string{"RATELIMITD_LEASE_INTERVAL", "soon"}, `RATELIMITD_LEASE_INTERVAL="soon"`},
		{"rlqs abandon", []string{"--rlqs-abandon-after=-1s"}, nil, `--rlqs-abandon-after=-1s: must not be negative`},
		{"rlqs headroom", []string{"--rlqs-headroom=0.5"}, nil, `--rlqs-headroom=0.5: must be in \[0, 0.5\)`},
		{"xds metadata", []string{"--config-source=xds", "--xds-node-metadata=a:b"}, nil, `--xds-node-metadata: item 1 is not key=value`},
		{"xds headers", nil, []string{"CONFIG_TYPE", "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "authorization"}, `--xds-headers: item 1 is not key:value`},
		{"xds backoff", []string{"--config-source=xds", "--xds-backoff-initial=2m"}, nil, `--xds-backoff-max=1m0s: must be >= --xds-backoff-initial`},
		{"xds factor", []string{"--config-source=xds", "--xds-backoff-random-factor=2"}, nil, `--xds-backoff-random-factor=2: must be in \[0, 1\]`},
		{"xds tls off", []string{"--config-source=xds", "--xds-tls-ca=ca.pem"}, nil, `--xds-tls-ca needs --xds-tls`},
		{"xds tls half", []string{"--config-source=xds", "--xds-tls", "--xds-tls-cert=c"}, nil, `--xds-tls-cert and --xds-tls-key go together`},
		{"xds legacy duration", nil, []string{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "soon"}, `XDS_CLIENT_BACKOFF_MAX_INTERVAL="soon"`},
		{"xds node id", []string{"--config-source=xds", "--xds-node-id="}, nil, `--xds-node-id: required`},
		{"sentinel short", nil, []string{"REDIS_TYPE", "sentinel", "REDIS_URL", "onlymaster"}, `REDIS_TYPE=sentinel`},
		{"cluster without addrs", []string{"--backend=redis", "--redis-mode=cluster"}, nil, `--redis-addrs`},
		{"ratio", []string{"--near-limit-ratio=1.5"}, nil, `near-limit-ratio`},
		{"tls half", []string{"--grpc-tls-cert=c"}, nil, `go together`},
		{"san without ca", []string{"--grpc-tls-cert=c", "--grpc-tls-key=k", "--grpc-tls-client-san=x"}, nil, `needs --grpc-tls-client-ca`},
		{"bad addr", []string{"--grpc-addr=8081"}, nil, `--grpc-addr`},
		{"empty grpc port", []string{"--grpc-addr=:"}, nil, `--grpc-addr=":": missing port`},
		{"empty http port", []string{"--http-addr=127.0.0.1:"}, nil, `--http-addr="127.0.0.1:": missing port`},
		{"empty debug port", []string{"--debug-addr=:"}, nil, `--debug-addr=":": missing port`},
		{"empty metrics port", []string{"--metrics-addr=:"}, nil, `--metrics-addr=":": missing port`},
		{"empty statsd port", []string{"--statsd-addr=localhost:"}, nil, `--statsd-addr="localhost:": missing port`},
		{"port out of range", []string{"--grpc-addr=127.0.0.1:99999"}, nil, `--grpc-addr="127.0.0.1:99999": bad port "99999"`},
		{"negative port", []string{"--http-addr=127.0.0.1:-1"}, nil, `--http-addr="127.0.0.1:-1": bad port`},
		{"positional", []string{"extra"}, nil, `no arguments`},
		{"several at once", []string{"--backend=x", "--log-level=loud"}, nil, `(?s)backend.*log-level`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Parse(tt.args, env(tt.env...), io.Discard)
			if err == nil {
				t.Fatal("no error")
			}
			if !regexp.MustCompile(tt.want).MatchString(err.Error()) {
				t.Errorf("error %q does not match %q", err, tt.want)
			}
		})
	}
}

// TestLegacyUnsupportedOneWarning: the reference's variables ratelimitd
// cannot honour are named in one warning line; supported or deliberately
// ignored ones are not.
func TestLegacyUnsupportedOneWarning(t *testing.T) {
	_, warnings, err := Parse(nil, env("USE_DOG_STATSD", "true", "USE_DOG_STATSD_MOGRIFIERS", "x", "TRACING_SERVICE_NAMESPACE", "ns", "TRACING_ENABLED", "true", "REDIS_PERSECOND", "true", "RUNTIME_WATCH_ROOT", "false", "SHADOW_MODE", "true", "USE_STATSD", "true", "STATSD_HOST", "x"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 {
		t.Fatalf("warnings = %q, want exactly one", warnings)
	}
	for _, name := range []string{"USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "TRACING_SERVICE_NAMESPACE", "REDIS_PERSECOND"} {
		if !strings.Contains(warnings[0], name) {
			t.Errorf("warning %q does not name %s", warnings[0], name)
		}
	}
	for _, name := range []string{"RUNTIME_WATCH_ROOT", "SHADOW_MODE", "TRACING_ENABLED", "USE_STATSD", "STATSD_HOST"} {
		if strings.Contains(warnings[0], name+",") || strings.HasSuffix(warnings[0], name) {
			t.Errorf("warning %q names supported/ignored %s", warnings[0], name)
		}
	}
	// USE_STATSD=false is what a Prometheus deployment sets: no warning.
	_, warnings, _ = Parse(nil, env("USE_STATSD", "false", "USE_PROMETHEUS", "true"), io.Discard)
	if len(warnings) != 0 {
		t.Errorf("warnings = %q, want none", warnings)
	}
}

// TestEveryFlagHasTwin: every flag has a RATELIMITD_* twin that sets it.
func TestEveryFlagHasTwin(t *testing.T) {
	o := Defaults()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	registerServeFlags(fs, &o)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if got := envName(f.Name); !regexp.MustCompile(`^RATELIMITD_[A-Z_]+$`).MatchString(got) {
			t.Errorf("twin of --%s is %q", f.Name, got)
		}
	})
	if n < 30 {
		t.Errorf("only %d flags", n)
	}
	// A twin really sets its flag: compare against the flag's own effect.
	for _, c := range []struct{ flag, val string }{
		{"http-addr", "127.0.0.1:1"}, {"debug-addr", ""}, {"key-prefix", "p"}, {"redis-pool-size", "9"},
		{"retry-jitter", "2s"}, {"request-overrides", "false"}, {"drain", "3s"}, {"local-cache-size", "5"},
		{"gc-percent", "200"}, {"memory-limit", "1GiB"}, {"memory-limit-ratio", "0.5"}, {"redis-breaker", "false"},
		{"config-source", "xds"}, {"xds-node-id", "n"}, {"xds-backoff-jitter", "false"}, {"xds-backoff-max", "2m"},
	} {
		viaFlag, _, err1 := Parse([]string{"--" + c.flag + "=" + c.val}, env(), io.Discard)
		viaEnv, _, err2 := Parse(nil, env(envName(c.flag), c.val), io.Discard)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v %v", c.flag, err1, err2)
		}
		if diff := cmp.Diff(viaFlag, viaEnv, ignoreFromEnv); diff != "" {
			t.Errorf("--%s vs %s (-flag +env):\n%s", c.flag, envName(c.flag), diff)
		}
		if cmp.Equal(viaFlag, Defaults(), ignoreFromEnv) {
			t.Errorf("--%s=%s changed nothing", c.flag, c.val)
		}
	}
}

// TestFlagsDocListsEveryFlag: docs/flags.md lists every serve flag (the
// README only the ten a newcomer needs).
func TestFlagsDocListsEveryFlag(t *testing.T) {
	readme, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	o := Defaults()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	registerServeFlags(fs, &o)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(string(readme), "`--"+f.Name+"`") {
			t.Errorf("docs/flags.md does not document `--%s`", f.Name)
		}
	})
}

// TestTracingOptions: the reference's tracing variables and the tracing
// flags reach Options; tracing is off by default.
func TestTracingOptions(t *testing.T) {
	o, _, err := Parse([]string{"--tracing-endpoint=collector:4317"}, env("TRACING_ENABLED", "true", "TRACING_SAMPLING_RATE", "0.25", "TRACING_SERVICE_NAME", "edge-rl"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Telemetry.Enabled || o.Telemetry.SampleRatio != 0.25 || o.Telemetry.ServiceName != "edge-rl" || o.Telemetry.Endpoint != "collector:4317" {
		t.Errorf("tracing options = %v %v %q %q", o.Telemetry.Enabled, o.Telemetry.SampleRatio, o.Telemetry.ServiceName, o.Telemetry.Endpoint)
	}
	d, _, err := Parse(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.Telemetry.Enabled || !d.IgnoreDotfiles {
		t.Errorf("defaults: tracing %v (want off), ignore-dotfiles %v (want on)", d.Telemetry.Enabled, d.IgnoreDotfiles)
	}
}

// ignoreFromEnv compares Options without their record of which values
// came from environment twins (Options.fromEnv).
var ignoreFromEnv = cmpopts.IgnoreUnexported(Options{}, rlqs.Options{})

// TestLegacySentinelURLNotPrinted: a REDIS_URL refused in sentinel mode is
// named, never quoted, since a mistaken value may hold a password.
func TestLegacySentinelURLNotPrinted(t *testing.T) {
	_, _, err := Parse(nil, env("REDIS_TYPE", "sentinel", "REDIS_URL", "redis://:s3cr3tpw@sentinel"), io.Discard)
	if err == nil {
		t.Fatal("no error")
	}
	if strings.Contains(err.Error(), "s3cr3tpw") {
		t.Errorf("error %q prints the password", err)
	}
	if !strings.Contains(err.Error(), "REDIS_URL must be master,host:port") {
		t.Errorf("error %q does not say what REDIS_URL must be", err)
	}
}

// TestLegacyURLWithUserInfo: envoyproxy/ratelimit's REDIS_URL is
// host:port; a value carrying user info is refused with a message that
// says so, without quoting it.
func TestLegacyURLWithUserInfo(t *testing.T) {
	for _, v := range []string{":s3cr3tpw@127.0.0.1:6379", "u:s3cr3tpw@h:1", "h:1/0"} {
		_, _, err := Parse(nil, env("REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", v), io.Discard)
		if err == nil {
			t.Errorf("REDIS_URL #%d accepted", len(v))
			continue
		}
		if strings.Contains(err.Error(), "s3cr3tpw") || !strings.Contains(err.Error(), "credentials go in REDIS_AUTH") {
			t.Errorf("REDIS_URL #%d: %v, want the host:port rule, unquoted", len(v), err)
		}
	}
}

// TestLeaseIntervalReachesLeaser: --lease-interval and its twin reach the
// Leaser's options; the default is the package's.
func TestLeaseIntervalReachesLeaser(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		want time.Duration
	}{
		{nil, nil, lease.DefaultInterval},
		{[]string{"--lease-interval=250ms"}, nil, 250 * time.Millisecond},
		{nil, []string{"RATELIMITD_LEASE_INTERVAL", "2s"}, 2 * time.Second},
		{[]string{"--lease-interval=1ms"}, []string{"RATELIMITD_LEASE_INTERVAL", "2s"}, time.Millisecond},
	} {
		o, _, err := Parse(c.args, env(c.env...), io.Discard)
		if err != nil {
			t.Fatalf("%v %v: %v", c.args, c.env, err)
		}
		lo := LeaseOptions(o, noLeaseStore{}, nil, nil)
		if lo.Interval != c.want {
			t.Errorf("%v %v: lease interval %v, want %v", c.args, c.env, lo.Interval, c.want)
		}
		if err := lo.Validate(); err != nil {
			t.Errorf("%v %v: %v", c.args, c.env, err)
		}
	}
}
