package serveopts

import (
	"slices"
	"strings"
	"testing"
)

// TestOwnersFollowBinding: a setting bound to a field of a package's
// options owns that field, by its path ("redis.Breaker.Window"); every
// error field a package's Validate names this way reaches its flag.
func TestOwnersFollowBinding(t *testing.T) {
	for _, c := range []struct {
		flag  string
		owner []string
	}{
		{"redis-url", []string{"redis.URL"}},
		{"redis-mode", []string{"redis.Mode"}},
		{"redis-breaker-window", []string{"redis.Breaker.Window"}},
		{"redis-breaker", []string{"redis.Breaker.Disabled"}},
		{"redis-tls-cert", []string{"redis.TLSCertFile"}},
		{"local-cache-size", []string{"redis.LocalCacheSize", "memcache.LocalCacheSize"}},
		{"memcache-srv-refresh", []string{"memcache.SRVRefresh"}},
		{"rlqs-headroom", []string{"rlqs.Headroom"}},
		{"near-limit-ratio", []string{"service.NearLimitRatio"}},
		{"log-decisions-rate", []string{"service.DecisionLogRate"}},
		{"grpc-addr", nil},
	} {
		i := slices.IndexFunc(settings, func(s setting) bool { return s.name == c.flag })
		if i < 0 {
			t.Fatalf("no setting --%s", c.flag)
		}
		if got := ownersOf(settings[i]); !slices.Equal(got, c.owner) {
			t.Errorf("--%s owns %q, want %q", c.flag, got, c.owner)
		}
	}
	// Each owned field is owned once.
	seen := map[string]string{}
	for _, s := range settings {
		for _, f := range ownersOf(s) {
			if prev, ok := seen[f]; ok {
				t.Errorf("%s owned by --%s and --%s", f, prev, s.name)
			}
			seen[f] = s.name
		}
	}
	if got := flagWords("redis.TLSCertFile", "TLSCertFile and TLSKeyFile go together"); !strings.Contains(got, "--redis-tls-cert and --redis-tls-key") {
		t.Errorf("flagWords = %q, want the flags named", got)
	}
}
