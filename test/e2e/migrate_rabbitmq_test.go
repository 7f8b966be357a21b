package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// topicMatch is RabbitMQ's topic exchange routing: words split on '.', '*'
// matches exactly one word, '#' zero or more.
func topicMatch(pattern, key string) bool {
	var match func(p, k []string) bool
	match = func(p, k []string) bool {
		if len(p) == 0 {
			return len(k) == 0
		}
		switch p[0] {
		case "#":
			for i := 0; i <= len(k); i++ {
				if match(p[1:], k[i:]) {
					return true
				}
			}
			return false
		case "*":
			return len(k) > 0 && match(p[1:], k[1:])
		}
		return len(k) > 0 && p[0] == k[0] && match(p[1:], k[1:])
	}
	return match(strings.Split(pattern, "."), strings.Split(key, "."))
}

func TestTopicMatch(t *testing.T) {
	for _, c := range []struct {
		p, k string
		want bool
	}{
		{"orders.#", "orders", true}, {"orders.#", "orders.eu.created", true}, {"orders.#", "payments.x", false},
		{"*.eu.*", "orders.eu.created", true}, {"*.eu.*", "orders.eu", false}, {"*.eu.*", "a.b.eu.c", false},
		{"#.audit", "audit", true}, {"#.audit", "billing.audit", true}, {"#.audit", "audit.x", false},
		{"payments.created", "payments.created", true}, {"#", "anything.at.all", true}, {"a.#.b", "a.b", true}, {"a.#.b", "a.x.y.b", true},
	} {
		if got := topicMatch(c.p, c.k); got != c.want {
			t.Errorf("topicMatch(%q, %q) = %v", c.p, c.k, got)
		}
	}
}

// TestMigrateRabbitMQDelayedExchange runs
// docs/migrate-rabbitmq-delayed-exchange.md for real. The old topology was a topic
// exchange of type x-delayed-message (x-delayed-type: topic) with the
// consumer queues bound to it. The new one: the publishers' exchange is a
// plain topic exchange bound only to delaybridge's ingest queue (the ingest
// declares that binding itself), and the consumer queues are bound, with
// the same patterns, to the exchange delaybridge publishes to, with the
// routing key each message was published with ({source.1:}). The publisher is
// written as plugin users write it: x-delay as an AMQP integer (int32 as Go
// and pika write it, int64 as Java's Long, the string form the plugin also
// reads), routing keys on the topic exchange, some messages without x-delay,
// which go at once (route.default_delay: 0s). The test computes what the
// plugin would have routed to each queue (topic routing is well defined; the
// test node has no plugin) and checks every queue gets exactly that, with
// the routing key and body unchanged, never before its delay.
func TestMigrateRabbitMQDelayedExchange(t *testing.T) {
	rmq := testenv.RabbitMQ(t)
	rs := testenv.Redis(t)
	run := conformance.RandomHex(4)
	events, delayed, ingestQueue := "events-"+run, "events-delayed-"+run, "delaybridge-"+run

	conn, err := amqp.Dial(rmq.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The consumers' side: their queues and patterns, as they were bound to
	// the x-delayed-message exchange, now bound to the exchange delaybridge
	// publishes to.
	bindings := map[string][]string{
		"orders-" + run:   {"orders.#"},
		"eu-" + run:       {"*.eu.*"},
		"payments-" + run: {"payments.created"},
		"audit-" + run:    {"#.audit", "orders.*.refunded"},
	}
	if err := ch.ExchangeDeclare(delayed, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for q, patterns := range bindings {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		for _, p := range patterns {
			if err := ch.QueueBind(q, p, delayed, false, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		for q := range bindings {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_, _ = ch.QueueDelete(ingestQueue, false, false, false)
		_ = ch.ExchangeDelete(delayed, false, false)
		_ = ch.ExchangeDelete(events, false, false)
	})

	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: dmx}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: delayed-events
    rabbitmq:
      url: "%s"
      queue: %s
      bindings: [{exchange: %s, routing_key: "#", exchange_type: topic}]
    route: {sink: events, destination: "{source.1:}", default_delay: 0s}
sinks:
  - name: events
    rabbitmq: {url: "%s", exchange: %s, mandatory: false}   # as the plugin: an unroutable message is dropped
`, rs.Addr, rmq.URL, ingestQueue, events, rmq.URL, delayed))
	t.Cleanup(d.stop)

	type received struct {
		key, seq string
		body     []byte
		headers  amqp.Table
		at       time.Time
	}
	var mu sync.Mutex
	got := map[string][]received{}
	for q := range bindings {
		cch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		deliveries, err := cch.Consume(q, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range deliveries {
				r := received{key: m.RoutingKey, body: m.Body, headers: m.Headers, at: time.Now().Round(0)}
				r.seq, _ = m.Headers["seq"].(string)
				mu.Lock()
				got[q] = append(got[q], r)
				mu.Unlock()
			}
		}()
	}

	// The publisher, unchanged but for the exchange type it declares
	// (x-delayed-message with x-delayed-type: topic before).
	pch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pch.ExchangeDeclare(events, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	keys := []string{"orders.eu.created", "orders.us.created", "orders.eu.refunded", "payments.created",
		"payments.eu.failed", "billing.audit", "misc.unrouted"}
	type sent struct {
		key   string
		delay time.Duration
		at    time.Time
	}
	const n = 60
	all := make([]sent, n)
	for i := range all {
		s := sent{key: keys[rand.IntN(len(keys))]}
		headers := amqp.Table{"seq": strconv.Itoa(i), "content-kind": "event"}
		if i%4 != 0 { // every fourth message has no x-delay: the plugin routes it at once
			ms := 200 + rand.IntN(2800)
			s.delay = time.Duration(ms) * time.Millisecond
			switch i % 3 {
			case 0:
				headers["x-delay"] = int32(ms) // Go (int32), pika (a Python int)
			case 1:
				headers["x-delay"] = int64(ms) // Java's Long
			default:
				headers["x-delay"] = strconv.Itoa(ms) // a string, which the plugin reads too
			}
		}
		s.at = time.Now().Round(0)
		if err := pch.PublishWithContext(context.Background(), events, s.key, false, false,
			amqp.Publishing{Headers: headers, Body: []byte("event " + strconv.Itoa(i) + " " + s.key), DeliveryMode: amqp.Persistent}); err != nil {
			t.Fatal(err)
		}
		all[i] = s
	}

	// What the plugin would have routed to each queue.
	want := map[string][]string{}
	total := 0
	for q, patterns := range bindings {
		for i, s := range all {
			if slices.ContainsFunc(patterns, func(p string) bool { return topicMatch(p, s.key) }) {
				want[q] = append(want[q], strconv.Itoa(i))
				total++
			}
		}
		sort.Strings(want[q])
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		c := 0
		for _, rs := range got {
			c += len(rs)
		}
		return c
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count() >= total && d.stats().Parked == 0 },
		"consumers did not get what the plugin would have routed")

	var late, immediate latency
	mu.Lock()
	defer mu.Unlock()
	for q, wantSeqs := range want {
		var seqs []string
		for _, r := range got[q] {
			seqs = append(seqs, r.seq)
			i, _ := strconv.Atoi(r.seq)
			s := all[i]
			if r.key != s.key {
				t.Errorf("%s: message %d has routing key %q, published with %q", q, i, r.key, s.key)
			}
			if string(r.body) != "event "+r.seq+" "+s.key || r.headers["content-kind"] != "event" {
				t.Errorf("%s: message %d body %q headers %v", q, i, r.body, r.headers)
			}
			if _, ok := r.headers["x-delay"]; ok {
				t.Errorf("%s: message %d carries x-delay", q, i)
			}
			due := s.at.Add(s.delay)
			if r.at.Before(due) {
				t.Errorf("%s: message %d arrived %v before its delay %v was over", q, i, due.Sub(r.at), s.delay)
			}
			if s.delay == 0 {
				immediate = append(immediate, r.at.Sub(s.at))
			} else {
				late = append(late, r.at.Sub(due))
			}
		}
		sort.Strings(seqs)
		if !slices.Equal(seqs, wantSeqs) {
			t.Errorf("queue %s got %v, the plugin would have routed %v", q, seqs, wantSeqs)
		}
	}
	for _, l := range append(late, immediate...) {
		if l > 10*time.Second {
			t.Errorf("a message arrived %v late: beyond any sanity bound", l)
		}
	}
	t.Logf("%d published, %d deliveries to %d queues as the plugin would route them; after x-delay: %s; without x-delay (at once): %s",
		n, total, len(bindings), late.summary(), immediate.summary())
}
