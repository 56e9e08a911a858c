package main

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// countingDialer dials TCP and counts the connections it opened.
type countingDialer struct{ n atomic.Int64 }

func (d *countingDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		d.n.Add(1)
	}
	return c, err
}

// ageServer serves a boundsService (rule d/k) and hs with
// grpcLimits(o).ServerOptions(), and returns a grpc-go client whose connections
// are counted by the returned dialer.
func ageServer(t *testing.T, o serveopts.Options, hs *health.Server) (*grpc.ClientConn, *countingDialer, string) {
	t.Helper()
	addr := boundsServer(t, o, boundsService(t, o), hs)
	d := &countingDialer{}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(d.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc, d, addr
}

// agedWatch serves as ageServer does with --grpc-max-connection-age=age
// and --grpc-max-connection-age-grace=grace, and opens a health Watch
// stream on the client's first connection, whose first answer SERVING it
// has read. It returns the client, its dialer, the health server, the
// test's context (canceled when t ends, at the latest after two minutes)
// and the stream.
func agedWatch(t *testing.T, age, grace time.Duration) (*grpc.ClientConn, *countingDialer, *health.Server, context.Context, grpc.ServerStreamingClient[healthpb.HealthCheckResponse]) {
	t.Helper()
	o := serveopts.Defaults()
	o.GRPCMaxConnectionAge, o.GRPCMaxConnectionAgeGrace = age, grace
	hs := health.NewServer()
	cc, dials, _ := ageServer(t, o, hs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	watch, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", r, err)
	}
	return cc, dials, hs, ctx, watch
}

func ageRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}},
	}}}
}

// TestGRPCMaxConnectionAgeGoAway: the server sends GOAWAY (NO_ERROR) on a
// connection older than --grpc-max-connection-age, read as HTTP/2 frames.
func TestGRPCMaxConnectionAgeGoAway(t *testing.T) {
	o := serveopts.Defaults()
	o.GRPCMaxConnectionAge = 100 * time.Millisecond
	addr := boundsServer(t, o, boundsService(t, o), health.NewServer())
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Bounds a hung server only; the age is 100 ms.
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY before: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			}
		case *http2.GoAwayFrame:
			if f.ErrCode != http2.ErrCodeNo {
				t.Fatalf("GOAWAY %v, want NO_ERROR", f.ErrCode)
			}
			return
		}
	}
}

// TestGRPCMaxConnectionAgeReconnects: a grpc-go client keeps calling
// through connections aged out by --grpc-max-connection-age: each GOAWAY
// moves new calls to a new connection (counted at the dialer) and no call
// fails, while a call in flight on the old connection (a health Watch
// stream) goes on within --grpc-max-connection-age-grace.
func TestGRPCMaxConnectionAgeReconnects(t *testing.T) {
	cc, dials, hs, ctx, watch := agedWatch(t, 150*time.Millisecond, time.Hour) // a grace longer than the test
	if n := dials.n.Load(); n != 1 {
		t.Fatalf("%d connections before any age, want 1", n)
	}

	// Callers loop until the client has dialed three connections: the
	// first two were each sent GOAWAY.
	rls := rlsv3.NewRateLimitServiceClient(cc)
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for dials.n.Load() < 3 && ctx.Err() == nil {
				if _, err := rls.ShouldRateLimit(ctx, ageRequest()); err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err)
					}
					continue
				}
				calls.Add(1)
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("%d connections after %d calls: the server never aged one out", dials.n.Load(), calls.Load())
	}
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d calls failed across GOAWAY, first: %v", n, n+calls.Load(), firstErr.Load())
	}

	// The stream opened on the first connection still delivers.
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch on the aged connection: %v %v, want NOT_SERVING", r, err)
	}
	if _, err := rls.ShouldRateLimit(ctx, ageRequest()); err != nil {
		t.Fatalf("call after the reconnects: %v", err)
	}
}

// TestGRPCMaxConnectionAgeGraceCuts: after the grace, a call still in
// flight on an aged connection is cut (Unavailable) and a new one succeeds
// on a new connection.
func TestGRPCMaxConnectionAgeGraceCuts(t *testing.T) {
	cc, dials, _, ctx, watch := agedWatch(t, 100*time.Millisecond, 100*time.Millisecond)
	// Nothing more is sent on the stream: it ends only when the server
	// closes the aged connection.
	_, err := watch.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("watch past the grace: %v, want Unavailable", err)
	}
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, ageRequest()); err != nil {
		t.Fatalf("call after the cut: %v", err)
	}
	if n := dials.n.Load(); n < 2 {
		t.Errorf("%d connections, want a new one after the cut", n)
	}
}

// TestGRPCMaxConnectionAgeFlags: the connection-age flags: defaults, twins,
// envoyproxy/ratelimit's variables, precedence and validation.
func TestGRPCMaxConnectionAgeFlags(t *testing.T) {
	d, _, err := serveopts.Parse(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.GRPCMaxConnectionAge != 5*time.Minute || d.GRPCMaxConnectionAgeGrace != 30*time.Second {
		t.Errorf("defaults: %s %s", d.GRPCMaxConnectionAge, d.GRPCMaxConnectionAgeGrace)
	}
	o, _, err := serveopts.Parse(nil, env("GRPC_MAX_CONNECTION_AGE", "24h", "GRPC_MAX_CONNECTION_AGE_GRACE", "1h"), io.Discard)
	if err != nil || o.GRPCMaxConnectionAge != 24*time.Hour || o.GRPCMaxConnectionAgeGrace != time.Hour {
		t.Errorf("reference variables: %v %s %s", err, o.GRPCMaxConnectionAge, o.GRPCMaxConnectionAgeGrace)
	}
	o, _, err = serveopts.Parse([]string{"--grpc-max-connection-age-grace=5s"}, env("GRPC_MAX_CONNECTION_AGE", "24h",
		"RATELIMITD_GRPC_MAX_CONNECTION_AGE", "10m", "GRPC_MAX_CONNECTION_AGE_GRACE", "1h"), io.Discard)
	if err != nil || o.GRPCMaxConnectionAge != 10*time.Minute || o.GRPCMaxConnectionAgeGrace != 5*time.Second {
		t.Errorf("precedence: %v %s %s", err, o.GRPCMaxConnectionAge, o.GRPCMaxConnectionAgeGrace)
	}
	o, _, err = serveopts.Parse([]string{"--grpc-max-connection-age=0", "--grpc-max-connection-age-grace=0s"}, env(), io.Discard)
	if err != nil || o.GRPCMaxConnectionAge != 0 || o.GRPCMaxConnectionAgeGrace != 0 {
		t.Errorf("0 (never, no bound): %v %+v", err, o)
	}
	for _, bad := range []string{"--grpc-max-connection-age=-1s", "--grpc-max-connection-age-grace=-1s"} {
		if _, _, err := serveopts.Parse([]string{bad}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), strings.SplitN(bad, "=", 2)[0]+"=") {
			t.Errorf("%s: err %v", bad, err)
		}
	}
	if _, _, err := serveopts.Parse(nil, env("GRPC_MAX_CONNECTION_AGE", "60"), io.Discard); err == nil ||
		err.Error() != `GRPC_MAX_CONNECTION_AGE="60": missing unit (e.g. 60ms or 60s)` {
		t.Errorf("GRPC_MAX_CONNECTION_AGE=60: %v", err)
	}
}
