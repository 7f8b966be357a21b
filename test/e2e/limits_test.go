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
// ingest pauses — nothing more is parked or acknowledged, /readyz says why —
// and resumes as messages fire, until everything is delivered.
func TestParkedLimitPausesIngest(t *testing.T) {
	e := newNATSEnv(t, "", "limits: {max_parked_messages: 40}\n")
	var ids []string
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("l-%03d", i)
			ids = append(ids, id)
			e.publish("delayed.l", []byte(id), "x-delay", "3000", "x-message-id", id)
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
	e.waitFired(60*time.Second, ids...)
	testenv.Eventually(t, 10*time.Second, func() bool { code, _ := e.d.get("/readyz", nil); return code == 200 }, "not ready after the backlog drained")
}
