package redis_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// TestUnixSocketDialFailuresAreRefused: a unix:// URL whose socket does
// not exist (ENOENT), or exists with nobody accepting on it
// (ECONNREFUSED), fails with cause refused, an outage, like a refused
// TCP port.
func TestUnixSocketDialFailuresAreRefused(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close() // the file stays; connecting to it is refused
	for name, path := range map[string]string{"missing": filepath.Join(dir, "nonexistent.sock"), "stale": stale} {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, slow(func(o *redis.Options) { o.URL = "unix://" + path }))
			err := c.Ping(context.Background()).Err()
			if got := redis.CauseOf(err); got != redis.CauseRefused {
				t.Fatalf("PING on %s socket: %v (cause %q), want cause %q", name, err, got, redis.CauseRefused)
			}
			var e *redis.Error
			if !errors.As(redis.Classify(err), &e) || !e.Outage() {
				t.Fatalf("PING on %s socket: %v is not an outage", name, err)
			}
		})
	}
}
