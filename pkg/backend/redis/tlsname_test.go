package redis_test

import (
	"context"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestTLSSkipHostnameStillVerifiesChain: Options.TLSSkipHostname (what
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION maps to) skips only the check of
// the name the server certificate was issued for:
//
//   - a server whose certificate chains to the configured CA but names
//     another host is accepted with it, and refused (cause auth) without
//     it;
//   - a server whose certificate another CA signed is refused with it
//     (cause auth), whatever its name.
func TestTLSSkipHostnameStillVerifiesChain(t *testing.T) {
	ctx := context.Background()
	// CA A's server, its certificate for a name that is not the host dialed.
	a := redistest.Standalone(t, redistest.WithTLSServerNames("redis.other.invalid"))
	// CA B: the same setup generated again, never seen by a's server.
	b, err := redistest.GenerateTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ping := func(ca string, skipHostname bool) error {
		c := newClient(t, slow(func(o *redis.Options) {
			o.URL, o.TLSCAFile, o.TLSSkipHostname = a.URL(), ca, skipHostname
		}))
		return c.Ping(ctx).Err()
	}

	if err := ping(a.TLS().CAFile, true); err != nil {
		t.Errorf("CA A, wrong hostname, skip-hostname: %v, want accepted", err)
	}
	if err := ping(a.TLS().CAFile, false); redis.CauseOf(err) != redis.CauseAuth {
		t.Errorf("CA A, wrong hostname, no skip-hostname: %v (cause %q), want refused with cause auth", err, redis.CauseOf(err))
	}
	if err := ping(b.CAFile, true); redis.CauseOf(err) != redis.CauseAuth {
		t.Errorf("CA B configured, skip-hostname: %v (cause %q), want refused with cause auth", err, redis.CauseOf(err))
	}
	// The same with the system roots (no CA file): a's CA is not among them.
	if err := ping("", true); redis.CauseOf(err) != redis.CauseAuth {
		t.Errorf("system roots, skip-hostname: %v (cause %q), want refused with cause auth", err, redis.CauseOf(err))
	}
}

// TestTLSSkipHostnameNeedsTLS: like the other TLS settings, skip-hostname
// with TLS off is refused by Validate.
func TestTLSSkipHostnameNeedsTLS(t *testing.T) {
	o := redis.DefaultOptions()
	o.TLSSkipHostname = true
	if err := o.Validate(); err == nil {
		t.Fatal("TLSSkipHostname with a redis:// URL and TLS off: accepted")
	}
}
