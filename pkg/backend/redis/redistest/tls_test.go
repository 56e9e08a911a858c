package redistest_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestTLSProtocols: WithTLSProtocols pins the versions the server accepts,
// alone and with WithTLSClientAuth, and TLSVersion reports the negotiated
// one; a client limited to the other version fails its handshake.
func TestTLSProtocols(t *testing.T) {
	cases := []struct {
		proto   string
		want    uint16
		other   uint16 // a version the server must refuse
		options []redistest.Option
	}{
		{"TLSv1.2", tls.VersionTLS12, tls.VersionTLS13, nil},
		{"TLSv1.3", tls.VersionTLS13, tls.VersionTLS12, nil},
		{"TLSv1.3", tls.VersionTLS13, tls.VersionTLS12, []redistest.Option{redistest.WithTLSClientAuth()}},
	}
	for _, c := range cases {
		s := redistest.Standalone(t, append([]redistest.Option{redistest.WithTLSProtocols(c.proto)}, c.options...)...)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := s.TLSVersion(ctx)
		if err != nil || v != c.want {
			t.Errorf("%s: negotiated %x, %v; want %x", c.proto, v, err, c.want)
		}
		cfg := s.TLS().ClientConfig()
		cfg.MinVersion, cfg.MaxVersion = c.other, c.other
		d := &tls.Dialer{Config: cfg}
		if conn, err := d.DialContext(ctx, "tcp", s.Addr()); err == nil {
			_ = conn.Close()
			t.Errorf("%s: a client limited to %x completed a handshake", c.proto, c.other)
		}
		cancel()
	}
	if _, err := redistest.Standalone(t).TLSVersion(context.Background()); err == nil {
		t.Error("TLSVersion without TLS: no error")
	}
}
