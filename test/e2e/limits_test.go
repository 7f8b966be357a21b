package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestParkedLimitPausesIngest: with limits.max_parked_messages reached,
// nothing more is parked or acknowledged, /readyz says why, and POST
// /v1/messages answers 503 with Retry-After; but cancels still go through
// (a header behind the waiting messages, of a parked one and of a waiting
// one; DELETE) and free room; parking resumes as messages fire, until
// everything else is delivered.
func TestParkedLimitPausesIngest(t *testing.T) {
	e := newNATSEnv(t, "", "limits: {max_parked_messages: 40}\n")
	var ids []string
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("l-%03d", i)
			ids = append(ids, id)
			e.publish("delayed.l", []byte(id), "x-delay", "6000", "x-message-id", id)
		}
	}
	publish(0, 40)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 40 }, "first 40 not parked")
	publish(40, 120)
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := e.d.get("/readyz", nil)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "max_parked_messages")
	}, "readyz does not report the limit")
	if p := e.d.stats().Parked; p != 40 {
		t.Fatalf("parked %d with a limit of 40", p)
	}
	code, body := e.d.send(http.MethodPost, "/v1/messages", `{"delay":"1s","sink":"out","destination":"fired.l","body":"api"}`, nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "max_parked_messages") {
		t.Fatalf("POST at the limit: %d %s", code, body)
	}
	// Cancels behind the 80 waiting messages: of a parked one and of a
	// waiting one, by header, and of a parked one by DELETE.
	e.publish("delayed.l", nil, "x-delay-cancel", "l-000", "x-message-id", "cancel-0")
	e.publish("delayed.l", nil, "x-delay-cancel", "l-100", "x-message-id", "cancel-100")
	testenv.Eventually(t, 5*time.Second, func() bool {
		n, _ := metricValue(e.d.metrics(), "delaybridge_ingest_messages_total", map[string]string{"result": "cancelled"})
		return n == 2
	}, "the cancels behind the waiting messages were not honoured")
	if code, body := e.d.do(http.MethodDelete, "/v1/messages/l-001", nil); code != http.StatusNoContent {
		t.Fatalf("DELETE at the limit: %d %s", code, body)
	}
	cancelled := map[string]bool{"l-000": true, "l-001": true, "l-100": true}
	var rest []string
	for _, id := range ids {
		if !cancelled[id] {
			rest = append(rest, id)
		}
	}
	e.waitFired(60*time.Second, rest...)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 0 }, "messages still parked")
	for id := range cancelled {
		if n := len(e.firedCopies(id)); n != 0 {
			t.Errorf("%s was cancelled and fired %d times", id, n)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { code, _ := e.d.get("/readyz", nil); return code == 200 }, "not ready after the backlog drained")
}
