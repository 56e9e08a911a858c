// Package telemetry wires OpenTelemetry tracing into ratelimitd: a server
// span per ShouldRateLimit call (W3C trace context from Envoy's gRPC
// metadata continues the caller's trace) and a child span per backend call.
// Tracing is off by default; when enabled, spans are exported over OTLP
// (gRPC) to Options.Endpoint.
package telemetry

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/opterr"
)

// Options configure tracing. The zero value disables it.
type Options struct {
	// Enabled turns tracing on (flag --tracing, default false).
	Enabled bool
	// Endpoint is the OTLP/gRPC collector address, host:port. Empty means
	// the standard OTEL_EXPORTER_OTLP_ENDPOINT / _TRACES_ENDPOINT
	// environment, else localhost:4317 (the OTLP gRPC port).
	Endpoint string
	// Insecure disables TLS to the collector (typical for a node-local
	// collector or an Istio sidecar that handles mTLS).
	Insecure bool
	// ServiceName is the resource attribute service.name (default "ratelimitd").
	ServiceName string
	// SampleRatio is the parent-based ratio sampler's ratio for root spans
	// in (0, 1]; a sampled parent from Envoy is always followed. 0 means
	// the default, 1 (every root span); NeverSample samples no root span.
	SampleRatio float64
	// Exporter overrides the OTLP exporter (tests).
	Exporter sdktrace.SpanExporter
}

// NeverSample is the SampleRatio that samples no root span (a sampled
// parent from Envoy is still followed); the zero SampleRatio is the
// default, 1.
const NeverSample = -1.0

// Validate reports a *opterr.FieldError for a SampleRatio outside [0, 1]
// that is not NeverSample, or NaN, whether or not tracing is enabled.
func (o Options) Validate() error {
	if !(o.SampleRatio >= 0 && o.SampleRatio <= 1) && o.SampleRatio != NeverSample {
		return &opterr.FieldError{Package: "telemetry", Field: "SampleRatio", Value: o.SampleRatio, Reason: "must be in [0, 1]"}
	}
	return nil
}

// Store is the shape of service.Store (declared here so telemetry depends on
// algo only).
type Store interface {
	// Take decides the hits of one request into out (service.Store.Take's
	// contract); the traced wrapper passes its decisions and error
	// through unchanged.
	Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error
}

// Tracing is a configured tracer provider. A disabled Tracing is valid and
// costs nothing per request.
type Tracing struct {
	provider trace.TracerProvider
	sdk      *sdktrace.TracerProvider
	prop     propagation.TextMapPropagator
}

// Setup builds the tracer provider. It does not contact the collector; the
// exporter connects lazily and drops spans while the collector is away.
func Setup(ctx context.Context, o Options) (*Tracing, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	if !o.Enabled {
		return &Tracing{provider: noop.NewTracerProvider(), prop: prop}, nil
	}
	if o.ServiceName == "" {
		o.ServiceName = "ratelimitd"
	}
	exp := o.Exporter
	if exp == nil {
		var opts []otlptracegrpc.Option
		if o.Endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpoint(o.Endpoint))
		}
		if o.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		var err error
		if exp, err = otlptracegrpc.New(ctx, opts...); err != nil {
			return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
		}
	}
	ratio := o.SampleRatio
	switch ratio {
	case 0:
		ratio = 1
	case NeverSample:
		ratio = 0
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		sdktrace.WithResource(sdkresource.NewSchemaless(attribute.String("service.name", o.ServiceName))),
	)
	return &Tracing{provider: tp, sdk: tp, prop: prop}, nil
}

// ServerOption returns the gRPC server option that starts a span for every
// call, continuing a W3C traceparent sent by Envoy.
func (t *Tracing) ServerOption() grpc.ServerOption {
	return grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.provider),
		otelgrpc.WithPropagators(t.prop),
	))
}

// Store wraps s so that every Take runs in a child span
// "ratelimitd.backend.take" with the number of hits and the error, if any.
// With tracing disabled it returns s unchanged.
func (t *Tracing) Store(s Store) Store {
	if t.sdk == nil {
		return s
	}
	return &tracedStore{next: s, tracer: t.provider.Tracer("github.com/ratelimitd/ratelimitd/pkg/telemetry")}
}

// Shutdown flushes pending spans, waiting at most until ctx is done.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

type tracedStore struct {
	next   Store
	tracer trace.Tracer
}

func (s *tracedStore) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	ctx, span := s.tracer.Start(ctx, "ratelimitd.backend.take", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int("ratelimitd.hits", len(hits))))
	defer span.End()
	err := s.next.Take(ctx, hits, out)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "backend error")
		var c interface{ Cause() string }
		if errors.As(err, &c) {
			span.SetAttributes(attribute.String("ratelimitd.backend.cause", c.Cause()))
		}
		return err
	}
	denied := 0
	for _, x := range out {
		if !x.Allowed {
			denied++
		}
	}
	span.SetAttributes(attribute.Int("ratelimitd.denied", denied))
	return nil
}

// Healthy forwards to the wrapped store when it reports health.
func (s *tracedStore) Healthy() bool {
	if h, ok := s.next.(interface{ Healthy() bool }); ok {
		return h.Healthy()
	}
	return true
}

// Reset forwards to the wrapped store's Reset (service.Resetter); without
// one it returns an error wrapping errors.ErrUnsupported.
func (s *tracedStore) Reset(ctx context.Context, hits []algo.Hit) error {
	if r, ok := s.next.(interface {
		Reset(context.Context, []algo.Hit) error
	}); ok {
		return r.Reset(ctx, hits)
	}
	return fmt.Errorf("telemetry: the traced store cannot reset counters: %w", errors.ErrUnsupported)
}

// Unwrap returns the traced store (for optional interfaces such as
// ResetCache).
func (s *tracedStore) Unwrap() Store { return s.next }
