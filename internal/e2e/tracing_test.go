package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// collector is a minimal OTLP/gRPC trace collector recording span names
// by trace id.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans map[string][]string // trace id (hex) -> span names
}

func (c *collector) Export(_ context.Context, r *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range r.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				id := hex.EncodeToString(s.GetTraceId())
				c.spans[id] = append(c.spans[id], s.GetName())
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// With --tracing, a ShouldRateLimit call carrying Envoy's W3C traceparent
// produces a server span and a backend span in Envoy's trace, exported to
// the OTLP collector (flushed at shutdown at the latest).
func TestTracingContinuesEnvoyTrace(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{spans: map[string][]string{}}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, col)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 3))
	p := start(t, startOpts{args: []string{"--config", dir, "--tracing", "--tracing-insecure", "--tracing-endpoint", lis.Addr().String()}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")

	const traceID = "0af7651916cd43dd8448eb211c80319c"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "traced")}}); err != nil {
		t.Fatal(err)
	}
	p.stop(t) // flushes the batch exporter

	col.mu.Lock()
	defer col.mu.Unlock()
	names := col.spans[traceID]
	var server, backend bool
	for _, n := range names {
		switch n {
		case "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit":
			server = true
		case "ratelimitd.backend.take":
			backend = true
		}
	}
	if !server || !backend {
		t.Fatalf("spans in Envoy's trace %s = %v, want the ShouldRateLimit server span and the backend span (all traces: %v)", traceID, names, col.spans)
	}
}
