package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/config"
)

// A problem in a list entry that has a name says which one by its name as
// well as its index: "ingest[1].route.sink (orders-in)", since "ingest[1]"
// alone sends the reader counting entries. A misspelt key
// gets the key it most likely meant. Problem.Path stays the plain path.
func TestProblemsNameTheEntryAndGuessTheKey(t *testing.T) {
	_, err := config.Parse([]byte(`
redis: {addr: "127.0.0.1:6379"}
log: {level: info, repeat_intervall: 5s}
colour: red
ingest:
  - name: payments-in
    nats: {url: "nats://127.0.0.1:4222", subject: "pay.>", stream: PAY}
    route: {sink: out, destination: pay.out}
  - name: orders-in
    nats: {url: "nats://127.0.0.1:4222", subject: "orders.>", stream: ORDERS}
    route: {sink: nope, destination: orders.out}
sinks:
  - name: out
    rabbitmq: {url: "amqp://127.0.0.1:5672/", exchnage: x}
`), noEnv)
	var ps config.Problems
	if !errors.As(err, &ps) {
		t.Fatalf("err = %v, want Problems", err)
	}
	text := err.Error()
	for _, want := range []string{
		`ingest[1].route.sink (orders-in): "nope" names no sink`,
		`log.repeat_intervall: unknown key; did you mean repeat_interval? (known keys here: format, level, repeat_interval)`,
		`sinks[0].rabbitmq.exchnage (out): unknown key; did you mean exchange?`,
		`colour: unknown key (known keys here:`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
	paths := map[string]bool{}
	for _, p := range ps {
		paths[p.Path] = true
	}
	if !paths["ingest[1].route.sink"] || !paths["sinks[0].rabbitmq.exchnage"] {
		t.Errorf("Problem.Path is not the plain path: %q", ps)
	}

	// The warnings of a valid file name their ingest too.
	cfg, err := config.Parse([]byte(`
redis: {addr: "127.0.0.1:6379"}
ingest:
  - name: orders-in
    nats: {url: "nats://127.0.0.1:4222", subject: "orders.>", stream: ORDERS}
    route: {sink: out, destination: fired.orders, allow_override: true}
sinks: [{name: out, nats: {url: "nats://127.0.0.1:4222"}}]
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.Warnings(); len(w) != 1 || !strings.HasPrefix(w[0].String(), "ingest[0].route.allowed_destinations (orders-in): not set") {
		t.Errorf("warnings: %q", w)
	}
}

// A route whose destination holds {source} is warned about: the whole
// name is one token there, and a dotted one makes the message dead.
func TestSourcePlaceholderWarned(t *testing.T) {
	cfg, err := config.Parse([]byte(`
redis: {addr: "127.0.0.1:6379"}
ingest:
  - name: whole
    nats: {url: "nats://127.0.0.1:4222", subject: "orders.>", stream: ORDERS}
    route: {sink: out, destination: "fired.{source}", allowed_destinations: ["fired.>"]}
  - name: tail
    nats: {url: "nats://127.0.0.1:4222", subject: "events.>", stream: EVENTS}
    route: {sink: out, destination: "fired.{source.1:}", allowed_destinations: ["fired.>"]}
sinks: [{name: out, nats: {url: "nats://127.0.0.1:4222"}}]
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.Warnings(); len(w) != 1 || !strings.HasPrefix(w[0].String(), "ingest[0].route.destination (whole): \"fired.{source}\": {source} is the message's whole name as one token") ||
		!strings.Contains(w[0].String(), "{source.1:}") {
		t.Errorf("warnings: %q", w)
	}
}

// A RabbitMQ binding to the exchange a sink publishes to, without its
// type, is warned about: on a fanout or headers exchange every key comes
// back, and only the binding's key is refused. With its type, it is not.
func TestUntypedBindingOnTheSinksExchangeWarned(t *testing.T) {
	for _, c := range []struct {
		typ, allowed string
		want         int
	}{{"", "", 1}, {", exchange_type: topic", "", 0}, {", exchange_type: fanout", ", allowed_destinations: [orders.fired]", 0}} {
		cfg, err := config.Parse([]byte(`
redis: {addr: "127.0.0.1:6379"}
ingest:
  - name: jobs
    rabbitmq: {url: "amqp://127.0.0.1:5672", queue: jobs-in, bindings: [{exchange: events, routing_key: "orders.in"`+c.typ+`}]}
    route: {sink: events, destination: orders.fired`+c.allowed+`}
sinks:
  - {name: events, rabbitmq: {url: "amqp://127.0.0.1:5672", exchange: events}}
  - {name: plain, rabbitmq: {url: "amqp://127.0.0.1:5672"}}
`), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		w := cfg.Warnings()
		if len(w) != c.want || (c.want == 1 && !strings.HasPrefix(w[0].String(), "ingest[0].rabbitmq.bindings[0].exchange_type (jobs): not set, and sink events publishes to exchange \"events\"")) {
			t.Errorf("binding%s: warnings %q, want %d", c.typ, w, c.want)
		}
	}
}
