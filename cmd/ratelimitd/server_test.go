package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
)

// newTestServer builds a server on loopback ports with a one-rule config.
func newTestServer(t *testing.T) *server {
	t.Helper()
	dir := t.TempDir()
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	writeTestFile(t, filepath.Join(dir, "c.yaml"), cfg)
	o, _, err := serveopts.Parse([]string{"--config=" + dir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=", "--shutdown-grace=5s"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newServer(o, gcpolicy.Policy{PercentSource: gcpolicy.SourceEnv, LimitSource: gcpolicy.SourceEnv}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestServerRunShutdown: Run serves /healthcheck once the config loaded;
// Shutdown makes Run return nil, releases the listeners, and a second Run
// is refused.
func TestServerRunShutdown(t *testing.T) {
	s := newTestServer(t)
	addr := "http://" + s.httpLn.Addr().String() + "/healthcheck"
	ran := make(chan error, 1)
	go func() { ran <- s.Run(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(addr)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck never answered 200 (last: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run after Shutdown: %v", err)
	}
	if _, err := http.Get(addr); err == nil {
		t.Error("the HTTP listener still answers after Shutdown")
	}
	if err := s.Run(context.Background()); err != errServerStopped {
		t.Errorf("second Run: %v, want errServerStopped", err)
	}
}

// TestServerShutdownBeforeRun: a server that never ran releases its
// listeners on Shutdown, and Run then refuses to start.
func TestServerShutdownBeforeRun(t *testing.T) {
	s := newTestServer(t)
	addr := s.grpcLn.Addr().String()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatalf("the gRPC port %s is still taken after Shutdown: %v", addr, err)
	}
	_ = l.Close()
	if err := s.Run(context.Background()); err != errServerStopped {
		t.Errorf("Run after Shutdown: %v, want errServerStopped", err)
	}
}
