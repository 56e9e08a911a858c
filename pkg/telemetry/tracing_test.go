package telemetry

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeStore struct{ err error }

func (f fakeStore) Take(_ context.Context, _ []algo.Hit, out []algo.Decision) error {
	if f.err != nil {
		return f.err
	}
	for i := range out {
		out[i].Allowed = i == 0
	}
	return nil
}

type causeErr struct{}

func (causeErr) Error() string { return "redis: i/o timeout" }
func (causeErr) Cause() string { return "timeout" }

// rls is a minimal RateLimitService that calls the (traced) store with the
// request context, as pkg/service does.
type rls struct {
	rlsv3.UnimplementedRateLimitServiceServer
	store Store
}

func (r rls) ShouldRateLimit(ctx context.Context, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	_, _ = algotest.Take(ctx, r.store, []algo.Hit{{Key: "k", Cost: 1}, {Key: "j", Cost: 1}})
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestServerSpanContinuesEnvoyTraceAndBackendSpanIsChild: the server span
// continues the trace of Envoy's traceparent, and the store's span is its
// child.
func TestServerSpanContinuesEnvoyTraceAndBackendSpanIsChild(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := Setup(context.Background(), Options{Enabled: true, Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(tr.ServerOption())
	rlsv3.RegisterRateLimitServiceServer(srv, rls{store: tr.Store(fakeStore{})})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	cc, err := grpc.NewClient("passthrough:///buf",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	// Envoy propagates W3C trace context as the traceparent header.
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background()) //nolint:errcheck
	// The server span ends after the response reached the client: flush
	// until both spans are exported.
	var spans tracetest.SpanStubs
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if err := tr.sdk.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if spans = exp.GetSpans(); len(spans) >= 2 {
			break
		}
	}
	var server, backend *tracetest.SpanStub
	for i := range spans {
		switch spans[i].SpanKind {
		case trace.SpanKindServer:
			server = &spans[i]
		case trace.SpanKindClient:
			backend = &spans[i]
		}
	}
	if server == nil || backend == nil {
		t.Fatalf("want a server and a backend span, got %d spans: %+v", len(spans), spans)
	}
	if got := server.SpanContext.TraceID().String(); got != traceID {
		t.Errorf("server span trace id = %s, want Envoy's %s", got, traceID)
	}
	if got := server.Parent.SpanID().String(); got != parentID {
		t.Errorf("server span parent = %s, want Envoy's span %s", got, parentID)
	}
	if backend.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("backend span parent = %s, want the server span %s", backend.Parent.SpanID(), server.SpanContext.SpanID())
	}
	if backend.Name != "ratelimitd.backend.take" {
		t.Errorf("backend span name = %q", backend.Name)
	}
	attrs := map[string]int64{}
	for _, a := range backend.Attributes {
		attrs[string(a.Key)] = a.Value.AsInt64()
	}
	if attrs["ratelimitd.hits"] != 2 || attrs["ratelimitd.denied"] != 1 {
		t.Errorf("backend span attributes = %v, want hits=2 denied=1", attrs)
	}
}

// TestBackendErrorRecorded: a store error passes through unchanged and
// marks the store's span with the error and its cause.
func TestBackendErrorRecorded(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := Setup(context.Background(), Options{Enabled: true, Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	s := tr.Store(fakeStore{err: causeErr{}})
	if _, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: "k", Cost: 1}}); !errors.As(err, new(causeErr)) {
		t.Fatalf("Take error = %v, want the backend's error unchanged", err)
	}
	_ = tr.sdk.ForceFlush(context.Background())
	spans := exp.GetSpans()
	defer tr.Shutdown(context.Background()) //nolint:errcheck
	if len(spans) != 1 || spans[0].Status.Description != "backend error" {
		t.Fatalf("spans = %+v, want one errored span", spans)
	}
	var cause string
	for _, a := range spans[0].Attributes {
		if a.Key == "ratelimitd.backend.cause" {
			cause = a.Value.AsString()
		}
	}
	if cause != "timeout" {
		t.Errorf("cause attribute = %q, want timeout", cause)
	}
}

// TestDisabledIsPassThrough: with tracing off the store is not wrapped,
// and a sample ratio above 1 is refused.
func TestDisabledIsPassThrough(t *testing.T) {
	tr, err := Setup(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var s Store = fakeStore{}
	if got := tr.Store(s); got != s {
		t.Errorf("disabled tracing wrapped the store: %T", got)
	}
	if _, err := Setup(context.Background(), Options{Enabled: true, SampleRatio: 2}); err == nil {
		t.Error("sample ratio 2 accepted")
	}
}

// TestOTLPExportReachesCollector: a store span is exported over OTLP/gRPC
// to a real collector by Shutdown.
func TestOTLPExportReachesCollector(t *testing.T) {
	col := testproc.StartOTLPCollector(t)
	tr, err := Setup(context.Background(), Options{Enabled: true, Endpoint: col.Addr(), Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := algotest.Take(context.Background(), tr.Store(fakeStore{}), []algo.Hit{{Key: "k", Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := col.Spans(); len(got) != 1 || got[0].Name != "ratelimitd.backend.take" {
		t.Fatalf("collector received %v, want one ratelimitd.backend.take span", got)
	}
}

var _ sdktrace.SpanExporter = (*tracetest.InMemoryExporter)(nil)

// resetStore is a fakeStore with Reset, recording the keys.
type resetStore struct {
	fakeStore
	keys *[]string
}

func (r resetStore) Reset(_ context.Context, hits []algo.Hit) error {
	for _, h := range hits {
		*r.keys = append(*r.keys, h.Key)
	}
	return nil
}

// TestTracedStoreForwardsReset: the traced store forwards Reset, and says
// ErrUnsupported for a store without one.
func TestTracedStoreForwardsReset(t *testing.T) {
	tr, err := Setup(context.Background(), Options{Enabled: true, Exporter: tracetest.NewInMemoryExporter()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background()) //nolint:errcheck
	type resetter interface {
		Reset(context.Context, []algo.Hit) error
	}
	var keys []string
	if err := tr.Store(resetStore{keys: &keys}).(resetter).Reset(context.Background(), []algo.Hit{{Key: "a"}, {Key: "b"}}); err != nil || len(keys) != 2 {
		t.Errorf("Reset: %v, keys %v", err, keys)
	}
	if err := tr.Store(fakeStore{}).(resetter).Reset(context.Background(), nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Reset of a store without one: %v, want ErrUnsupported", err)
	}
}

// TestSampleRatioZeroValues: the zero SampleRatio samples every root span
// (the default, 1), NeverSample none, and a sampled parent is followed
// under either.
func TestSampleRatioZeroValues(t *testing.T) {
	parent := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true,
	}))
	for _, c := range []struct {
		name      string
		ratio     float64
		root, sub int // spans exported for a root call and for one under a sampled parent
	}{
		{"zero is the default 1", 0, 1, 1},
		{"NeverSample", NeverSample, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tr, err := Setup(context.Background(), Options{Enabled: true, Exporter: exp, SampleRatio: c.ratio})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Shutdown(context.Background()) //nolint:errcheck
			st := tr.Store(fakeStore{})
			hits := []algo.Hit{{Key: "k", Cost: 1}}
			count := func(ctx context.Context) int {
				exp.Reset()
				if _, err := algotest.Take(ctx, st, hits); err != nil {
					t.Fatal(err)
				}
				if err := tr.sdk.ForceFlush(context.Background()); err != nil {
					t.Fatal(err)
				}
				return len(exp.GetSpans())
			}
			if n := count(context.Background()); n != c.root {
				t.Errorf("root call exported %d spans, want %d", n, c.root)
			}
			if n := count(parent); n != c.sub {
				t.Errorf("call under a sampled parent exported %d spans, want %d", n, c.sub)
			}
		})
	}
	if err := (Options{SampleRatio: -0.5}).Validate(); err == nil {
		t.Error("SampleRatio -0.5 accepted")
	}
}
