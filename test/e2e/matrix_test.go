package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// received is one message as a sink's consumer saw it.
type received struct {
	headers  map[string]string // lower-case keys
	body     []byte
	key      []byte
	brokerID string    // AMQP message_id / Nats-Msg-Id
	at       time.Time // when the sink broker had it: Kafka record time, JetStream time; AMQP: consumer receive time
}

// matrix is one daemon with a Kafka, a RabbitMQ and a NATS ingest and sink.
type matrix struct {
	t       *testing.T
	kafka   *testenv.KafkaCluster
	rabbit  *testenv.RabbitNode
	nats    *testenv.NATSServer
	js      jetstream.JetStream
	amqpCh  *amqp.Channel
	kwriter *kafka.Writer
	pending []kafka.Message // Kafka ingest records, written by flush

	mu  sync.Mutex
	got map[string][]received // by x-message-id
}

var kinds = []string{"kafka", "rabbitmq", "nats"}

// TestMatrix sends 300 messages with random delays up to 2 s through each of
// the 3 x 3 pairings of ingest and sink, through the real binary: all are
// delivered, none early, body, headers, key and ID as the contract says.
func TestMatrix(t *testing.T) {
	m := &matrix{t: t, got: map[string][]received{}}
	m.kafka = testenv.Kafka(t, testenv.WithTopic("in", 3))
	for _, from := range kinds {
		m.kafka.CreateTopic(t, "out-"+from, 3)
	}
	m.rabbit = testenv.RabbitMQ(t)
	m.nats = testenv.NATS(t)
	redis := testenv.Redis(t)
	m.setupConsumers()

	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: matrix}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, backoff: {initial: 100ms, max: 1s}}
ingest:
  - name: kafka
    kafka: {brokers: ["%[2]s"], topic: in, group: delaybridge, session_timeout: 2s}
    route: {sink: nats, destination: unused, allow_override: true}
  - name: rabbitmq
    rabbitmq: {url: "%[3]s", queue: in}
    route: {sink: nats, destination: unused, allow_override: true}
  - name: nats
    nats: {url: "%[4]s", subject: "in.>", stream: IN}
    route: {sink: nats, destination: unused, allow_override: true}
sinks:
  - name: kafka
    kafka: {brokers: ["%[2]s"]}
  - name: rabbitmq
    rabbitmq: {url: "%[3]s", exchange: ""}
  - name: nats
    nats: {url: "%[4]s", jetstream: true}
`, redis.Addr, strings.Join(m.kafka.Brokers, `", "`), m.rabbit.URL, m.nats.URL))

	type sentMsg struct {
		from, to string
		body     []byte
		key      []byte
		sentAt   time.Time // before the publish began
		delay    time.Duration
	}
	sent := map[string]sentMsg{}
	const perPair = 300
	for _, from := range kinds {
		for _, to := range kinds {
			for i := 0; i < perPair; i++ {
				id := fmt.Sprintf("%s-%s-%03d", from, to, i)
				body := make([]byte, 1+rand.IntN(200))
				for j := range body {
					body[j] = byte(rand.IntN(256))
				}
				var key []byte
				if from == "kafka" {
					key = []byte("key-" + id)
				}
				delay := rand.IntN(2001)
				sent[id] = sentMsg{from, to, body, key, time.Now(), time.Duration(delay) * time.Millisecond}
				m.publish(from, id, body, key, map[string]string{
					"x-delay":             strconv.Itoa(delay),
					"x-message-id":        id,
					"x-delay-sink":        to,
					"x-delay-destination": m.destination(to, from),
					"x-custom":            "c-" + id,
				})
			}
		}
	}
	m.flush()

	arrived := testenv.Poll(60*time.Second, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.got) >= len(sent)
	})
	if !arrived {
		missing := map[string]int{}
		m.mu.Lock()
		for id, s := range sent {
			if len(m.got[id]) == 0 {
				missing[s.from+"->"+s.to]++
			}
		}
		m.mu.Unlock()
		dead := d.dead()
		if len(dead) > 3 {
			dead = dead[:3]
		}
		t.Fatalf("not every message arrived within 60 s; missing per pairing: %v; daemon stats %+v, dead (first 3) %+v",
			missing, d.stats(), dead)
	}

	late := map[string]latency{}
	dups := map[string]int{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, s := range sent {
		pair := s.from + "->" + s.to
		copies := m.got[id]
		if len(copies) == 0 {
			t.Errorf("%s: not delivered", id)
			continue
		}
		dups[pair] += len(copies) - 1
		r := copies[0]
		if !bytes.Equal(r.body, s.body) {
			t.Errorf("%s: body changed", id)
		}
		for k, want := range map[string]string{"x-custom": "c-" + id, "x-message-id": id, "x-delaybridge-attempt": "1"} {
			if r.headers[k] != want {
				t.Errorf("%s: header %s = %q, want %q", id, k, r.headers[k], want)
			}
		}
		for _, k := range []string{"x-delay", "x-delay-sink", "x-delay-destination"} {
			if _, ok := r.headers[k]; ok {
				t.Errorf("%s: control header %s forwarded", id, k)
			}
		}
		if s.to != "kafka" && r.brokerID != id {
			t.Errorf("%s: broker message ID %q", id, r.brokerID)
		}
		if s.to == "kafka" && s.from == "kafka" && !bytes.Equal(r.key, s.key) {
			t.Errorf("%s: key %q, want %q", id, r.key, s.key)
		}
		due, err := time.Parse(time.RFC3339Nano, r.headers[envelope.HeaderDueAt])
		if err != nil {
			t.Errorf("%s: due-at header %q", id, r.headers[envelope.HeaderDueAt])
			continue
		}
		// Kafka record timestamps have millisecond precision, like due times.
		if r.at.Truncate(time.Millisecond).Before(due) {
			t.Errorf("%s: at the sink %v, before its due time %v", id, r.at, due)
		}
		// A delay ends no earlier than the send plus the delay: it counts
		// from the JetStream time, the moment of ingest (RabbitMQ) or the
		// record's timestamp, which Kafka keeps in whole milliseconds.
		sentAt := s.sentAt
		if s.from == "kafka" {
			sentAt = sentAt.Truncate(time.Millisecond)
		}
		if due.Before(sentAt.Add(s.delay)) {
			t.Errorf("%s: due %v, before its send (%v) plus its delay %v", id, due, s.sentAt, s.delay)
		}
		late[pair] = append(late[pair], r.at.Sub(due))
	}
	pairs := make([]string, 0, len(late))
	for p := range late {
		pairs = append(pairs, p)
	}
	sort.Strings(pairs)
	for _, p := range pairs {
		t.Logf("%-18s lateness %s, duplicates %d", p, late[p].summary(), dups[p])
	}
}

// destination is where the pairing from->to delivers in sink to.
func (m *matrix) destination(to, from string) string {
	switch to {
	case "kafka":
		return "out-" + from
	case "rabbitmq":
		return "out-" + from
	}
	return "out." + from
}

func (m *matrix) record(r received) {
	m.mu.Lock()
	id := r.headers["x-message-id"]
	m.got[id] = append(m.got[id], r)
	m.mu.Unlock()
}

func (m *matrix) setupConsumers() {
	t := m.t
	ctx := context.Background()
	// NATS: an ingest stream and a sink stream.
	nc, err := nats.Connect(m.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	m.js, _ = jetstream.New(nc)
	for name, subj := range map[string]string{"IN": "in.>", "OUT": "out.>"} {
		if _, err := m.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
	}
	cons, _ := m.js.OrderedConsumer(ctx, "OUT", jetstream.OrderedConsumerConfig{})
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		md, _ := msg.Metadata()
		r := received{headers: map[string]string{}, body: msg.Data(), at: md.Timestamp, brokerID: msg.Headers().Get("Nats-Msg-Id")}
		for k, v := range msg.Headers() {
			r.headers[strings.ToLower(k)] = v[0]
		}
		m.record(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)

	// RabbitMQ: the ingest queue and one sink queue per ingest kind.
	conn, err := amqp.Dial(m.rabbit.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m.amqpCh, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.amqpCh.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"in", "out-kafka", "out-rabbitmq", "out-nats"} {
		if _, err := m.amqpCh.QueueDelete(q, false, false, false); err != nil {
			t.Fatal(err)
		}
		if _, err := m.amqpCh.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, from := range kinds {
		deliveries, err := cch.Consume("out-"+from, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for d := range deliveries {
				r := received{headers: map[string]string{}, body: d.Body, at: time.Now(), brokerID: d.MessageId}
				for k, v := range d.Headers {
					r.headers[strings.ToLower(k)] = fmt.Sprint(v)
				}
				m.record(r)
			}
		}()
	}

	// Kafka: a writer for the ingest topic and a reader per sink topic.
	m.kwriter = &kafka.Writer{Addr: kafka.TCP(m.kafka.Brokers...), Topic: "in", RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, Balancer: &kafka.Hash{}}
	t.Cleanup(func() { m.kwriter.Close() })
	rctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	for _, from := range kinds {
		rd := kafka.NewReader(kafka.ReaderConfig{Brokers: m.kafka.Brokers, Topic: "out-" + from, GroupID: "matrix-" + from,
			SessionTimeout: 2 * time.Second, MaxWait: 50 * time.Millisecond, StartOffset: kafka.FirstOffset})
		t.Cleanup(func() { rd.Close() })
		go func() {
			for {
				msg, err := rd.ReadMessage(rctx)
				if rctx.Err() != nil {
					return
				}
				if err != nil { // e.g. the group is not ready yet: try again
					t.Logf("kafka reader out-%s: %v (retrying)", from, err)
					time.Sleep(100 * time.Millisecond) // pacing a retry, not synchronisation
					continue
				}
				r := received{headers: map[string]string{}, body: msg.Value, key: msg.Key, at: msg.Time}
				for _, h := range msg.Headers {
					r.headers[strings.ToLower(h.Key)] = string(h.Value)
				}
				m.record(r)
			}
		}()
	}
}

// publish sends one message into an ingest the way an application would.
func (m *matrix) publish(kind, id string, body, key []byte, headers map[string]string) {
	t := m.t
	switch kind {
	case "kafka":
		msg := kafka.Message{Key: key, Value: body}
		for k, v := range headers {
			msg.Headers = append(msg.Headers, kafka.Header{Key: k, Value: []byte(v)})
		}
		m.pending = append(m.pending, msg)
	case "rabbitmq":
		tbl := amqp.Table{}
		for k, v := range headers {
			tbl[k] = v
		}
		if k, err := strconv.Atoi(headers["x-delay"]); err == nil {
			tbl["x-delay"] = int32(k) // as RabbitMQ's delayed exchange publishers send it
		}
		conf, err := m.amqpCh.PublishWithDeferredConfirm("", "in", false, false,
			amqp.Publishing{Headers: tbl, Body: body, DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatal(err)
		}
		if !conf.Wait() {
			t.Fatal("rabbitmq nacked a publish")
		}
	case "nats":
		msg := nats.NewMsg("in." + id)
		msg.Data = body
		for k, v := range headers {
			msg.Header.Set(k, v)
		}
		if _, err := m.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
}

func (m *matrix) flush() {
	if err := m.kwriter.WriteMessages(context.Background(), m.pending...); err != nil {
		m.t.Fatal(err)
	}
	m.pending = nil
}
