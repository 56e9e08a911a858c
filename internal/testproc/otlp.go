package testproc

import (
	"context"
	"encoding/hex"
	"net"
	"slices"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// Span is one span an OTLPCollector received.
type Span struct {
	// TraceID is the span's trace id, 32 lower-case hex digits (W3C
	// traceparent's trace-id); "" when the exporter sent none.
	TraceID string
	// Name is the span's name, e.g. "ratelimitd.backend.take".
	Name string
}

// OTLPCollector is a minimal OTLP/gRPC trace collector (the
// opentelemetry-proto TraceService) on a loopback port, recording every
// span exported to it. Safe for concurrent use.
type OTLPCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	lis   net.Listener
	mu    sync.Mutex
	spans []Span // in arrival order
}

// StartOTLPCollector starts an OTLPCollector (plain gRPC, no TLS), stopped
// when t ends.
func StartOTLPCollector(t testing.TB) *OTLPCollector {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &OTLPCollector{lis: lis}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return c
}

// Addr is the collector's host:port, an OTLP/gRPC endpoint.
func (c *OTLPCollector) Addr() string { return c.lis.Addr().String() }

// Spans returns the spans received so far, in arrival order.
func (c *OTLPCollector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans)
}

// Export records the spans of r (TraceService.Export); it never fails.
func (c *OTLPCollector) Export(_ context.Context, r *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range r.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, Span{TraceID: hex.EncodeToString(s.GetTraceId()), Name: s.GetName()})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}
