package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// TestDestinationTemplates runs one daemon with a NATS, a Kafka and a
// RabbitMQ ingest, each routed with a destination template, and checks
// that {source}, {source.N}, {source.N:} and
// {header.NAME} expand from each broker's own name of the message (the
// subject, the topic, the routing key it was published with); a message the
// template cannot expand for (no such header, no tokens in an empty routing
// key, a header value with a newline) is dead with the reason; the messages
// behind it still go through. `delaybridge validate` refuses an unknown
// placeholder with its path.
func TestDestinationTemplates(t *testing.T) {
	ns := testenv.NATS(t)
	kc := testenv.Kafka(t, testenv.WithTopic("tmpl-in", 2))
	rmq := testenv.RabbitMQ(t)
	rs := testenv.Redis(t)
	run := conformance.RandomHex(4)
	exchange, queue := "tmpl-ex-"+run, "tmpl-in-"+run

	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fired := make(chan *nats.Msg, 100)
	if _, err := nc.ChanSubscribe("fired.>", fired); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	cfg := fmt.Sprintf(`
redis: {addr: "%s", key_prefix: tmpl}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: from-nats
    nats: {url: "%s", subject: "delayed.>", stream: TMPL_DELAYED}
    route: {sink: out, destination: "fired.nats.{source.2:}"}
  - name: from-kafka
    kafka: {brokers: ["%s"], topic: tmpl-in, group: tmpl, session_timeout: 2s}
    route: {sink: out, destination: "fired.{source}.{header.tenant}"}
  - name: from-rabbit
    rabbitmq:
      url: "%s"
      queue: %s
      bindings: [{exchange: %s, routing_key: "#", exchange_type: topic}]
    route: {sink: out, destination: "fired.rabbit.{source.1}"}
sinks:
  - name: out
    nats: {url: "%s", jetstream: false}
`, rs.Addr, ns.URL, strings.Join(kc.Brokers, `", "`), rmq.URL, queue, exchange, ns.URL)

	// validate: an unknown placeholder is a problem with its path.
	bad := strings.Replace(cfg, "fired.{source}.{header.tenant}", "fired.{topic}", 1)
	badPath := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(badPath, []byte(strings.ReplaceAll(bad, "%ADMIN%", "127.0.0.1:1")), 0o644); err != nil {
		t.Fatal(err)
	}
	v := testenv.StartProcess(t, testenv.Build(t), "validate", "-c", badPath)
	if code := v.Wait(30 * time.Second); code == 0 || !strings.Contains(v.Output(), `ingest[1].route.destination (from-kafka): "fired.{topic}": unknown placeholder "{topic}"`) {
		t.Fatalf("validate of an unknown placeholder: exit %d\n%s", code, v.Output())
	}

	d := startDaemon(t, cfg)
	t.Cleanup(d.stop)

	// NATS: the subject, tokens 2.. of it.
	pubNATS := func(subject, id string) {
		m := nats.NewMsg(subject)
		m.Data = []byte(id)
		m.Header.Set("x-delay", "100")
		m.Header.Set("x-message-id", id)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	// Kafka: the topic and a header.
	w := &kafka.Writer{Addr: kafka.TCP(kc.Brokers...), Topic: "tmpl-in", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	pubKafka := func(id string, headers ...string) {
		m := kafka.Message{Value: []byte(id), Headers: []kafka.Header{{Key: "x-delay", Value: []byte("100")}, {Key: "x-message-id", Value: []byte(id)}}}
		for i := 0; i+1 < len(headers); i += 2 {
			m.Headers = append(m.Headers, kafka.Header{Key: headers[i], Value: []byte(headers[i+1])})
		}
		if err := w.WriteMessages(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	// RabbitMQ: the routing key it was published with to the exchange the
	// ingest queue is bound to.
	conn, err := amqp.Dial(rmq.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ch.ExchangeDelete(exchange, false, false)
		_, _ = ch.QueueDelete(queue, false, false, false)
	})
	pubRabbit := func(key, id string) {
		if err := ch.PublishWithContext(context.Background(), exchange, key, false, false,
			amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{"x-delay": int32(100)}}); err != nil {
			t.Fatal(err)
		}
	}

	// First what cannot expand, then what can: nothing waits behind a
	// rejected message.
	pubKafka("k-no-tenant")
	pubKafka("k-newline", "tenant", "eu\nus")
	pubRabbit("", "r-empty-key")
	pubNATS("delayed.orders.created.eu", "n-1")
	pubKafka("k-1", "tenant", "eu")
	pubRabbit("orders.created", "r-1")

	want := map[string]string{ // x-message-id -> subject
		"n-1": "fired.nats.orders.created.eu",
		"k-1": "fired.tmpl-in.eu",
		"r-1": "fired.rabbit.orders",
	}
	got := map[string]string{}
	deadline := time.After(30 * time.Second)
	for len(got) < len(want) {
		select {
		case m := <-fired:
			got[m.Header.Get(envelope.HeaderMessageID)] = m.Subject
		case <-deadline:
			t.Fatalf("fired %v, want %v", got, want)
		}
	}
	for id, subj := range want {
		if got[id] != subj {
			t.Errorf("%s published to %q, want %q", id, got[id], subj)
		}
	}

	reasons := map[string]string{
		"k-no-tenant": `route.destination "fired.{source}.{header.tenant}": {header.tenant}: the message has no header tenant`,
		"k-newline":   `{header.tenant} "eu\nus" holds white space or a control character`,
		"r-empty-key": `route.destination "fired.rabbit.{source.1}": {source.1}: the source name "" has 0 dot-separated tokens`,
	}
	var dead []deadMessage
	testenv.Eventually(t, 10*time.Second, func() bool { dead = d.dead(); return len(dead) >= len(reasons) }, "the rejected messages are not dead")
	for _, m := range dead {
		want, ok := reasons[m.ID]
		if !ok {
			t.Errorf("unexpected dead message %s: %s", m.ID, m.Reason)
			continue
		}
		if !strings.Contains(m.Reason, want) {
			t.Errorf("%s dead with reason %q, want it to contain %q", m.ID, m.Reason, want)
		}
		delete(reasons, m.ID)
	}
	if len(reasons) > 0 {
		t.Errorf("not dead: %v", reasons)
	}
	if n, _ := metricValue(d.metrics(), "delaybridge_ingest_rejected_total", map[string]string{"reason": string(envelope.CodeInvalidDestination)}); n != 3 {
		t.Errorf("ingest_rejected_total{reason=invalid_destination} = %v, want 3", n)
	}
}
