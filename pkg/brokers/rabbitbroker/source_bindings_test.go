package rabbitbroker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
)

func openBound(t *testing.T, url, queue string, bindings ...rabbitbroker.Binding) (*rabbitbroker.Source, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rabbitbroker.NewSource(ctx, rabbitbroker.SourceParams{Name: "test", URL: url, Queue: queue, Prefetch: 10, Bindings: bindings}, quiet)
	if err == nil {
		t.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	return s, err
}

// An ingest declares its own topology: the queue, bound to a topic exchange
// (declared when exchange_type says so) and to an existing one, each with
// its pattern. Incoming.Source is the routing key a message was published
// with, not the queue.
func TestSourceBindings(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q, declared, existing := unique(t), unique(t)+"-topic", unique(t)+"-direct"
	if err := a.ch.ExchangeDeclare(existing, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	s, err := openBound(t, node.URL, q,
		rabbitbroker.Binding{Exchange: declared, RoutingKey: "orders.#", ExchangeType: amqp.ExchangeTopic},
		rabbitbroker.Binding{Exchange: existing, RoutingKey: "audit"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.ch.ExchangeDelete(declared, false, false) })
	pub := func(exchange, key string) {
		t.Helper()
		dc, err := a.ch.PublishWithDeferredConfirm(exchange, key, false, false, amqp.Publishing{Body: []byte(key)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("confirm %v %v", ok, err)
		}
	}
	// The queue receives what its bindings route, in publish order: the
	// non-matching keys never arrive before the matching ones behind them.
	pub(declared, "payments.created")
	pub(declared, "orders.eu.created")
	pub(existing, "other")
	pub(existing, "audit")
	for _, want := range []string{"orders.eu.created", "audit"} {
		in, ack := read(t, s)
		if in.Source != want || string(in.Body) != want {
			t.Fatalf("Source %q body %q, want %q", in.Source, in.Body, want)
		}
		if err := ack(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Binding again at the next connect is a no-op.
	closeSource(t, s)
	if _, err := openBound(t, node.URL, q, rabbitbroker.Binding{Exchange: declared, RoutingKey: "orders.#", ExchangeType: amqp.ExchangeTopic}); err != nil {
		t.Fatalf("reopen: %v", err)
	}
}

func TestSourceBindingErrors(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	missing := unique(t)
	_, err := openBound(t, node.URL, unique(t), rabbitbroker.Binding{Exchange: missing, RoutingKey: "#"})
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing exchange: %v", err)
	}
	fanout := unique(t)
	if err := a.ch.ExchangeDeclare(fanout, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, err = openBound(t, node.URL, unique(t), rabbitbroker.Binding{Exchange: fanout, RoutingKey: "#", ExchangeType: amqp.ExchangeTopic})
	if err == nil || !strings.Contains(err.Error(), "another type") {
		t.Fatalf("exchange of another type: %v", err)
	}
}
