package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestFailedPublishesSpeakUp on the real binary and a real RabbitMQ: a
// thousand messages routed to a routing key no queue is bound to must not
// fail in silence (with only inspect to show it): the first failure is one
// WARN naming the sink, the destination, the
// reason and the broker's words; the 999 others within log.repeat_interval
// are not a line each but a count, on the next line of that destination;
// and delaybridge_sink_publish_errors_total{sink,reason="unroutable"}
// counts all 1,000.
func TestFailedPublishesSpeakUp(t *testing.T) {
	rs, rmq := testenv.Redis(t), testenv.RabbitMQ(t)
	run := conformance.RandomHex(4)
	in, nowhere := "speak-in-"+run, "speak-nowhere-"+run
	conn, err := amqp.Dial(rmq.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(in, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(in, false, false, false) })
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1000))

	// Retries an hour away: each message fails once, so the metric counts
	// exactly the thousand.
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: speak}
admin: {listen: "%%ADMIN%%"}
log: {repeat_interval: 5s}
scheduler: {backoff: {initial: 1h, max: 2h}}
ingest:
  - name: jobs
    rabbitmq: {url: %q, queue: %s}
    route: {sink: r, destination: %s}
sinks:
  - name: r
    rabbitmq: {url: %q}
`, rs.Addr, rmq.URL, in, nowhere, rmq.URL))
	t.Cleanup(d.stop)

	const n = 1000
	for i := range n {
		id := fmt.Sprintf("m%d", i)
		if err := ch.Publish("", in, false, false, amqp.Publishing{MessageId: id, Body: []byte(id),
			Headers: amqp.Table{"x-delay": int64(500)}}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if c := <-confirms; !c.Ack {
			t.Fatal("the broker nacked a publish to the ingest queue")
		}
	}

	errs := func() float64 {
		v, _ := metricValue(d.metrics(), "delaybridge_sink_publish_errors_total", map[string]string{"sink": "r", "reason": "unroutable"})
		return v
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return errs() >= n },
		"delaybridge_sink_publish_errors_total{sink=r,reason=unroutable} did not reach %d", n)
	if v := errs(); v != n {
		t.Errorf("delaybridge_sink_publish_errors_total{sink=r,reason=unroutable} = %v, want %d (each message failed once)", v, n)
	}

	// The WARN lines about the destination, in order.
	warns := func() []string {
		var out []string
		for _, l := range strings.Split(d.proc.Output(), "\n") {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "publish failed") && strings.Contains(l, "destination="+nowhere) {
				out = append(out, l)
			}
		}
		return out
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(warns()) >= 2 },
		"no line with the count of the failures not logged; output:\n%s", lazyOutput{d})
	w := warns()
	t.Logf("the WARN lines:\n%s", strings.Join(w, "\n"))
	first, next := w[0], w[1]
	if !strings.Contains(first, `msg="publish failed"`) || !strings.Contains(first, "sink=r") ||
		!strings.Contains(first, "reason=unroutable") || !strings.Contains(first, "NO_ROUTE") {
		t.Errorf("the first WARN does not name the sink, the reason and the broker's words:\n%s", first)
	}
	if !strings.Contains(next, fmt.Sprintf("not_logged=%d", n-1)) {
		t.Errorf("the next line does not count the %d failures not logged:\n%s", n-1, next)
	}
	if len(w) != 2 {
		t.Errorf("%d WARN lines about %s for %d failed publishes, want 2:\n%s", len(w), nowhere, n, strings.Join(w, "\n"))
	}
}

// lazyOutput prints the daemon's output when a failure message is built.
type lazyOutput struct{ d *daemon }

func (l lazyOutput) String() string { return l.d.proc.Output() }
