package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

// TestTracingContinuesEnvoyTrace: with --tracing, a ShouldRateLimit call
// carrying Envoy's W3C traceparent produces a server span and a backend
// span in Envoy's trace, exported to the OTLP collector (flushed at
// shutdown at the latest).
func TestTracingContinuesEnvoyTrace(t *testing.T) {
	col := testproc.StartOTLPCollector(t)

	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 3))
	p := start(t, startOpts{args: []string{"--config", dir, "--tracing", "--tracing-insecure", "--tracing-endpoint", col.Addr()}})
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

	all := col.Spans()
	var names []string
	for _, sp := range all {
		if sp.TraceID == traceID {
			names = append(names, sp.Name)
		}
	}
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
		t.Fatalf("spans in Envoy's trace %s = %v, want the ShouldRateLimit server span and the backend span (all spans: %v)", traceID, names, all)
	}
}
