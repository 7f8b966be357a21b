// Package tracing continues a W3C trace through delaybridge with
// OpenTelemetry: a "delaybridge.park" span, child of the ingest message's
// traceparent, and a "delaybridge.fire" span, child of the park span, whose
// context goes out as the sink message's traceparent. The trace context
// survives the wait in Redis because the park span's traceparent replaces
// the stored message's.
//
// Tracing is off unless configured (tracing.enabled); the exporter is OTLP
// over HTTP, configured by the standard OTEL_EXPORTER_OTLP_* environment
// variables (endpoint, headers, timeout...). Off, every method is a no-op
// that allocates nothing, and traceparent headers pass through unchanged.
package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Tracer starts delaybridge's spans. The zero value (and nil) is off.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
}

// Config of tracing.
type Config struct {
	Enabled     bool
	SampleRatio float64 // of new traces; a sampled parent is always followed
	Version     string  // service.version
}

// Setup starts the OTLP exporter when cfg.Enabled. shutdown flushes spans.
func Setup(ctx context.Context, cfg Config) (t *Tracer, shutdown func(context.Context) error, err error) {
	if !cfg.Enabled {
		return nil, func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w (check OTEL_EXPORTER_OTLP_ENDPOINT)", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName("delaybridge"), semconv.ServiceVersion(cfg.Version)))
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	)
	return New(tp), tp.Shutdown, nil
}

// New returns a Tracer on a TracerProvider (tests pass one with an
// in-memory exporter).
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer("github.com/delaybridge/delaybridge")}
}

// Span is a started span; End it once.
type Span struct{ span trace.Span }

// End ends the span, recording err when non-nil.
func (s Span) End(err error) {
	if s.span == nil {
		return
	}
	if err != nil {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.End()
}

// StartPark starts the park span of m, a child of m's traceparent header
// when it has one, and replaces m's traceparent (and tracestate) with the
// span's, so that the fire span continues from it.
func (t *Tracer) StartPark(ctx context.Context, m *envelope.Message) Span {
	if t == nil {
		return Span{}
	}
	c := carrier{h: &m.Headers}
	ctx = t.prop.Extract(ctx, c)
	ctx, span := t.tracer.Start(ctx, "delaybridge.park", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.message.id", m.ID),
			attribute.String("delaybridge.ingest", m.Ingest),
			attribute.String("delaybridge.due_at", envelope.FormatTime(m.DueAt)),
			attribute.String("delaybridge.sink", m.Sink),
			attribute.String("messaging.destination.name", m.Destination),
		))
	t.prop.Inject(ctx, c)
	return Span{span}
}

// StartFire starts the fire span of m, a child of its stored traceparent,
// and sets m's traceparent to the fire span's, which the sink publishes.
func (t *Tracer) StartFire(ctx context.Context, m *envelope.Message, attempt int) Span {
	if t == nil {
		return Span{}
	}
	c := carrier{h: &m.Headers}
	ctx = t.prop.Extract(ctx, c)
	ctx, span := t.tracer.Start(ctx, "delaybridge.fire", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.message.id", m.ID),
			attribute.String("delaybridge.sink", m.Sink),
			attribute.String("messaging.destination.name", m.Destination),
			attribute.String("delaybridge.due_at", envelope.FormatTime(m.DueAt)),
			attribute.Int("delaybridge.attempt", attempt),
		))
	t.prop.Inject(ctx, c)
	return Span{span}
}

// carrier adapts envelope.Headers to a propagation.TextMapCarrier, with
// case-insensitive keys.
type carrier struct{ h *envelope.Headers }

func (c carrier) Get(key string) string {
	v, _ := c.h.Get(key)
	return v
}

func (c carrier) Set(key, value string) {
	h := *c.h
	for i := range h {
		if strings.EqualFold(h[i].Key, key) {
			h[i].Value = value
			return
		}
	}
	*c.h = append(h, envelope.Header{Key: key, Value: value})
}

func (c carrier) Keys() []string {
	keys := make([]string, len(*c.h))
	for i, kv := range *c.h {
		keys[i] = kv.Key
	}
	return keys
}
