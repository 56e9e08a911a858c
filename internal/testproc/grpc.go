package testproc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Dial opens a plaintext gRPC client connection to addr (host:port),
// closed when t ends.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Health is cc's grpc.health.v1 status of service ("" for the server as
// a whole), asked with a 2 s deadline; an error when the check itself
// failed.
func Health(cc *grpc.ClientConn, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

// WaitHealth polls Health of service every 10 ms until it is want, and
// returns an error with the last status and error when within passes
// first.
func WaitHealth(cc *grpc.ClientConn, service string, want healthpb.HealthCheckResponse_ServingStatus, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		st, err := Health(cc, service)
		if err == nil && st == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("health %q not %v within %v (last: %v, %v)", service, want, within, st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
