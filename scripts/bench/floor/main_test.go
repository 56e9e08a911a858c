package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// serve runs the floor server in mode on a real redis-server and returns
// a client and the server.
func serve(t *testing.T, mode, limits string) (rlsv3.RateLimitServiceClient, *redistest.Server) {
	t.Helper()
	srv := redistest.Standalone(t)
	s, err := newServer(srv.Addr(), mode, limits)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	return rlsv3.NewRateLimitServiceClient(testproc.Dial(t, l.Addr().String())), srv
}

// TestFloorCountsExactly: in every mode, many concurrent callers on one
// key of limit L get exactly L OK answers, the rest OVER_LIMIT, and Redis
// holds the count of every hit.
func TestFloorCountsExactly(t *testing.T) {
	for _, mode := range []string{"lua", "pipe", "batch", "loop"} {
		t.Run(mode, func(t *testing.T) {
			const limit, callers, calls = 137, 24, 20
			// A window of 100,000 hours: no run spans a boundary.
			c, srv := serve(t, mode, fmt.Sprintf("k=%d/100000h", limit))
			var ok, over atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, callers*calls)
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range calls {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d",
							Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("k", "v")}})
						cancel()
						switch {
						case err != nil:
							errs <- err
						case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
							ok.Add(1)
						default:
							over.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if ok.Load() != limit || over.Load() != callers*calls-limit {
				t.Errorf("%d OK, %d OVER_LIMIT; want %d and %d", ok.Load(), over.Load(), limit, callers*calls-limit)
			}
			keys, err := srv.Do(context.Background(), "KEYS", "floor_d_k_v_*")
			if err != nil {
				t.Fatal(err)
			}
			ks, _ := keys.([]any)
			if len(ks) != 1 {
				t.Fatalf("keys %v, want one", keys)
			}
			n, err := srv.Do(context.Background(), "GET", ks[0])
			if err != nil || n != fmt.Sprint(callers*calls) {
				t.Errorf("count %v (%v), want %d", n, err, callers*calls)
			}
			ttl, err := srv.Do(context.Background(), "TTL", ks[0])
			if err != nil || ttl.(int64) <= 0 {
				t.Errorf("TTL %v (%v), want one set", ttl, err)
			}
		})
	}
}

// TestFloorBadFlags: an unknown mode or a malformed limit is refused.
func TestFloorBadFlags(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, c := range []struct{ mode, limits, want string }{
		{"bulk", "", "mode"},
		{"lua", "k=10", "key=rate/period"},
		{"lua", "k=10/1500ms", "whole seconds"},
		{"lua", "k=x/1s", "invalid syntax"},
	} {
		_, err := newServer(srv.Addr(), c.mode, c.limits)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("newServer(%q, %q): %v, want an error with %q", c.mode, c.limits, err, c.want)
		}
	}
}
