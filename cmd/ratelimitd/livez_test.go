package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
)

// TestLivezIgnoresConfig: with a config that does not load, /healthcheck
// answers 500 (not ready) while /livez answers 200: the process serves, so
// a liveness probe on /livez does not restart a pod whose ConfigMap is bad.
func TestLivezIgnoresConfig(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "c.yaml"), "domain: d\nbogus: 1\n")
	o, _, err := serveopts.Parse([]string{"--config=" + dir, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=", "--shutdown-grace=5s"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newServer(o, gcpolicy.Policy{PercentSource: gcpolicy.SourceEnv, LimitSource: gcpolicy.SourceEnv}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- s.Run(context.Background()) }()
	base := "http://" + s.httpLn.Addr().String()
	get := func(path string) int {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	// The first load has failed once the config source reported it; the
	// HTTP listener answers from the start.
	deadline := time.Now().Add(10 * time.Second)
	for get("/livez") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("/livez never answered 200 with a bad config")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 5 {
		if c := get("/healthcheck"); c != http.StatusInternalServerError {
			t.Errorf("/healthcheck = %d with no config loaded, want 500", c)
		}
		if c := get("/livez"); c != http.StatusOK {
			t.Errorf("/livez = %d, want 200", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
