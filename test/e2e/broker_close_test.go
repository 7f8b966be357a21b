package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestBrokerCloseCountsAgainstTheMessage on the real binary: a routing key
// amq.rabbitmq.reply-to.* that names no live consumer makes RabbitMQ close
// the sink's connection (541 INTERNAL_ERROR) at each publish. With a route
// that names the key (otherwise refused at ingest) the message must count
// an attempt at each publish, up to scheduler.max_attempts, and be dead
// with the broker's reason; the healthy messages sent beside it arrive on
// time, and the sink is never held as down.
func TestBrokerCloseCountsAgainstTheMessage(t *testing.T) {
	rs, rmq := testenv.Redis(t), testenv.RabbitMQ(t)
	run := conformance.RandomHex(4)
	in, out := "close-in-"+run, "close-out-"+run
	conn, err := amqp.Dial(rmq.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{in, out} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(in, false, false, false)
		_, _ = ch.QueueDelete(out, false, false, false)
	})

	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: close}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, max_attempts: 3, backoff: {initial: 300ms, max: 600ms}}
ingest:
  - name: jobs
    rabbitmq: {url: %q, queue: %s}
    route: {sink: r, destination: %s, allow_override: true, allowed_destinations: [%s, "amq.rabbitmq.reply-to.#"]}
sinks:
  - name: r
    rabbitmq: {url: %q}
`, rs.Addr, rmq.URL, in, out, out, rmq.URL))
	t.Cleanup(d.stop)

	type arrival struct{ at, due time.Time }
	var mu sync.Mutex
	got := map[string]arrival{}
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := cch.Consume(out, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range deliveries {
			due, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(m.Headers["x-delaybridge-due-at"]))
			mu.Lock()
			if _, dup := got[m.MessageId]; !dup {
				got[m.MessageId] = arrival{at: time.Now().Round(0), due: due}
			}
			mu.Unlock()
		}
	}()

	pub := func(id string, delay time.Duration, headers amqp.Table) {
		t.Helper()
		h := amqp.Table{"x-delay": int64(delay / time.Millisecond), "x-message-id": id}
		for k, v := range headers {
			h[k] = v
		}
		if err := ch.Publish("", in, false, false, amqp.Publishing{MessageId: id, Headers: h, Body: []byte(id), DeliveryMode: amqp.Persistent}); err != nil {
			t.Fatal(err)
		}
	}
	// The bad one first, then healthy ones due with it and after it, while
	// it fails its attempts.
	pub("bad", 500*time.Millisecond, amqp.Table{"x-delay-destination": "amq.rabbitmq.reply-to.g1h2AA==.x"})
	const healthy = 30
	for i := range healthy {
		pub(fmt.Sprintf("h%d", i), 500*time.Millisecond+time.Duration(i)*100*time.Millisecond, nil)
	}

	testenv.Eventually(t, 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == healthy
	}, "every healthy message delivered")
	mu.Lock()
	for id, a := range got {
		if late := a.at.Sub(a.due); late > 2*time.Second {
			t.Errorf("%s arrived %v after its due time", id, late)
		}
	}
	mu.Unlock()

	var dead []deadMessage
	testenv.Eventually(t, 60*time.Second, func() bool {
		dead = d.dead()
		return len(dead) > 0
	}, "the message to the reply-to key is not dead")
	if len(dead) != 1 || dead[0].ID != "bad" || !strings.Contains(dead[0].Reason, "publish failed 3 times") ||
		!strings.Contains(dead[0].Reason, "INTERNAL_ERROR") {
		t.Errorf("dead: %+v, want bad, dead after 3 attempts with the broker's reason", dead)
	}
	if n, _ := metricValue(d.metrics(), "delaybridge_sink_held_total", map[string]string{"sink": "r"}); n != 0 {
		t.Errorf("delaybridge_sink_held_total{sink=r} = %v: the sink was held as down", n)
	}
}
