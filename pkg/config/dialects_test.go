package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
)

// Destination templates, dialects and RabbitMQ bindings: what is valid, the
// defaults, and every problem with its path.
func TestDialectsTemplatesBindings(t *testing.T) {
	cfg, err := config.Parse([]byte(`
redis: {addr: "a:1"}
ingest:
  - name: sched
    kafka: {brokers: ["k:1"], topic: schedules, group: g}
    dialects: [delaybridge, kafka-scheduler]
    route: {sink: s, destination: "{source}.fired", allow_override: true}
  - name: rabbit
    rabbitmq:
      url: "amqp://x"
      queue: delayed
      bindings:
        - {exchange: events, routing_key: "#", exchange_type: topic}
        - {exchange: amq.topic, routing_key: "orders.*"}
    route: {sink: s, destination: "{source}", default_delay: 0s}
  - name: nats
    nats: {url: "nats://x:1", subject: "delayed.>", stream: S}
    route: {sink: s, destination: "fired.{source.2:}.{header.tenant}.{{x}}"}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Ingest[0].Dialects; !slices.Equal(d, []string{"delaybridge", "kafka-scheduler"}) {
		t.Errorf("dialects %v", d)
	}
	if d := cfg.Ingest[1].Dialects; !slices.Equal(d, []string{"delaybridge"}) {
		t.Errorf("default dialects %v", d)
	}
	b := cfg.Ingest[1].Broker.(*rabbitbroker.IngestConfig).Bindings
	if len(b) != 2 || b[0] != (rabbitbroker.Binding{Exchange: "events", RoutingKey: "#", ExchangeType: "topic"}) || b[1].ExchangeType != "" {
		t.Errorf("bindings %+v", b)
	}

	_, err = config.Parse([]byte(`
redis: {addr: "a:1"}
ingest:
  - name: k
    kafka: {brokers: ["k:1"], topic: t, group: g}
    dialects: [kafka-scheduler, etf1, kafka-scheduler]
    route: {sink: s, destination: "{sourec}"}
  - name: r
    rabbitmq:
      url: "amqp://x"
      queue: q
      bindings:
        - {routing_key: "#"}
        - {exchange: old, exchange_type: x-delayed-message}
        - {exchange: e, exchange_type: headers}
        - {exchange: amq.topic, exchange_type: topic}
    dialects: [kafka-scheduler]
    route: {sink: s, destination: "q.{source.0}", allow_override: true}
  - name: n
    nats: {url: "nats://x:1", subject: "a.>", stream: S}
    route: {sink: s, destination: "{header.}{"}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`), noEnv)
	var ps config.Problems
	if !errors.As(err, &ps) {
		t.Fatalf("err = %v, want Problems", err)
	}
	for _, want := range []string{
		`ingest[0].dialects[0] (k): kafka-scheduler publishes to the record's scheduler-target-topic: set route.allow_override: true`,
		`ingest[0].dialects[1] (k): "etf1" is not one of delaybridge, kafka-scheduler`,
		`ingest[0].dialects[2] (k): "kafka-scheduler" is given twice`,
		`ingest[0].route.destination (k): "{sourec}": unknown placeholder "{sourec}"`,
		`ingest[1].rabbitmq.bindings[0].exchange (r): required`,
		`ingest[1].rabbitmq.bindings[1].exchange_type (r): x-delayed-message is the plugin delaybridge replaces`,
		`ingest[1].rabbitmq.bindings[2].exchange_type (r): "headers" is not one of direct, topic, fanout`,
		`ingest[1].rabbitmq.bindings[3].exchange_type (r): "amq.topic" is a built-in exchange`,
		`ingest[1].dialects[0] (r): kafka-scheduler reads Kafka records (key, tombstones): only on a kafka ingest, not rabbitmq`,
		`ingest[1].route.destination (r): "q.{source.0}": placeholder "{source.0}": the token number must be an integer from 1`,
		`ingest[2].route.destination (n): "{header.}{": placeholder "{header.}": a header name is required`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%s", want, err)
		}
	}
}
