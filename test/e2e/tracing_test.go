package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestNATSTracing runs the daemon with tracing on, exporting to a fake OTLP
// collector: the sink message's traceparent continues the ingest message's
// trace, and the collector receives the park and fire spans of that trace.
func TestNATSTracing(t *testing.T) {
	var (
		mu    sync.Mutex
		spans = map[string]string{} // span name -> trace ID (hex)
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					spans[s.Name] = hexID(s.TraceId)
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	defer collector.Close()

	e := newNATSEnv(t, "", "tracing: {enabled: true}\n",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL, "OTEL_BSP_SCHEDULE_DELAY=100")
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	e.publish("delayed.t", []byte("traced"), "x-delay", "100", "x-message-id", "traced",
		"traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	e.waitFired(10*time.Second, "traced")
	tp := e.firedCopies("traced")[0].headers.Get("traceparent")
	if !strings.HasPrefix(tp, "00-"+traceID+"-") || strings.Contains(tp, "00f067aa0ba902b7") {
		t.Fatalf("sink traceparent %q: want trace %s with delaybridge's fire span", tp, traceID)
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return spans["delaybridge.park"] == traceID && spans["delaybridge.fire"] == traceID
	}, "park and fire spans not exported to the collector")
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}
