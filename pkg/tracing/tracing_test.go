package tracing

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestParkAndFireContinueTheIngestTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tr := New(tp)

	m := &envelope.Message{ID: "m1", DueAt: time.Now(), Sink: "s", Destination: "d",
		Headers: envelope.Headers{{Key: "Traceparent", Value: parent}, {Key: "x", Value: "y"}}}
	tr.StartPark(context.Background(), m).End(nil)
	afterPark, _ := m.Headers.Get("traceparent")
	if m.Headers.Count("traceparent") != 1 || afterPark == parent || !strings.HasPrefix(afterPark, "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
		t.Fatalf("after park traceparent = %q (headers %v): want the same trace, a new span", afterPark, m.Headers)
	}

	// Later, in another process: the message comes back from Redis.
	stored := envelope.Encode(nil, m)
	fired, err := envelope.Decode("m1", stored)
	if err != nil {
		t.Fatal(err)
	}
	tr.StartFire(context.Background(), fired, 2).End(errors.New("broker down"))
	out, _ := fired.OutHeaders(2).Get("traceparent")

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	park, fire := spans[0], spans[1]
	if park.Name != "delaybridge.park" || fire.Name != "delaybridge.fire" {
		t.Fatalf("span names %q %q", park.Name, fire.Name)
	}
	wantTrace, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	if park.SpanContext.TraceID() != wantTrace || fire.SpanContext.TraceID() != wantTrace {
		t.Fatal("spans left the ingest trace")
	}
	if park.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("park parent %s, want the ingest span", park.Parent.SpanID())
	}
	if fire.Parent.SpanID() != park.SpanContext.SpanID() {
		t.Fatal("fire is not a child of park")
	}
	if !strings.Contains(out, fire.SpanContext.SpanID().String()) {
		t.Fatalf("published traceparent %q is not the fire span %s", out, fire.SpanContext.SpanID())
	}
	if fire.Status.Description != "broker down" {
		t.Fatalf("fire status %+v", fire.Status)
	}
}

func TestOffIsANoOp(t *testing.T) {
	var tr *Tracer
	m := &envelope.Message{Headers: envelope.Headers{{Key: "traceparent", Value: parent}}}
	tr.StartPark(context.Background(), m).End(nil)
	tr.StartFire(context.Background(), m, 1).End(nil)
	if v, _ := m.Headers.Get("traceparent"); v != parent || len(m.Headers) != 1 {
		t.Fatalf("headers changed while off: %v", m.Headers)
	}
	tr2, shutdown, err := Setup(context.Background(), Config{Enabled: false})
	if tr2 != nil || err != nil || shutdown(context.Background()) != nil {
		t.Fatal("disabled Setup must return a nil tracer")
	}
	if allocs := testing.AllocsPerRun(100, func() { tr.StartPark(context.Background(), m).End(nil) }); allocs != 0 {
		t.Fatalf("off costs %v allocations", allocs)
	}
}
