package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The identity and order tests (docs/reference.md, "The guarantee"),
// through the real binary and the three real ingests: a re-read (the same
// broker message delivered again) of a delivered ID is a duplicate; any
// other message with that ID, a new publish, parks as new; of two versions
// the newer one wins by the broker's own order.

// identityEnv is one daemon with a JetStream, a Kafka and a RabbitMQ
// ingest, each routed to its own core NATS subject fired.<kind>.
type identityEnv struct {
	t      *testing.T
	d      *daemon
	cfg    string
	nc     *nats.Conn
	js     jetstream.JetStream
	kw     *kafka.Writer
	ch     *amqp.Channel
	queue  string
	stream string

	mu    sync.Mutex
	fired map[string][]string // "<kind> <id>" -> bodies in order
	seen  chan struct{}       // a fire arrived
}

var identityKinds = []string{"nats", "kafka", "rabbit"}

func newIdentityEnv(t *testing.T, extra string, env ...string) *identityEnv {
	return newIdentityEnvBin(t, "", extra, env...)
}

// newIdentityEnvBin starts the servers and a daemon built as bin ("" for the
// ordinary build); extra is appended to the configuration's top level.
func newIdentityEnvBin(t *testing.T, bin, extra string, env ...string) *identityEnv {
	ns, rs, rmq := testenv.NATS(t), testenv.Redis(t), testenv.RabbitMQ(t)
	run := conformance.RandomHex(4)
	topic := "ident-" + run
	kc := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	e := &identityEnv{t: t, fired: map[string][]string{}, seen: make(chan struct{}, 1), queue: "ident-" + run, stream: "IDENT_" + run}
	var err error
	if e.nc, err = nats.Connect(ns.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	e.js, _ = jetstream.New(e.nc)
	if _, err := e.nc.Subscribe("fired.>", func(m *nats.Msg) {
		kind := strings.TrimPrefix(m.Subject, "fired.")
		e.mu.Lock()
		key := kind + " " + m.Header.Get("x-message-id")
		e.fired[key] = append(e.fired[key], string(m.Data))
		e.mu.Unlock()
		select {
		case e.seen <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	e.kw = &kafka.Writer{Addr: kafka.TCP(kc.Brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1000}
	t.Cleanup(func() { _ = e.kw.Close() })
	conn, err := amqp.Dial(rmq.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if e.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := e.ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.ch.QueueDelete(e.queue, false, false, false) })
	e.cfg = fmt.Sprintf(`
redis: {addr: %q, key_prefix: ident}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: nats
    nats: {url: %q, subject: "ident.%s.>", stream: %s, ack_wait: 2s}
    route: {sink: out, destination: fired.nats}
  - name: kafka
    kafka: {brokers: [%q], topic: %s, group: ident, session_timeout: 2s}
    route: {sink: out, destination: fired.kafka}
  - name: rabbit
    rabbitmq: {url: %q, queue: %s}
    route: {sink: out, destination: fired.rabbit}
sinks:
  - name: out
    nats: {url: %q, jetstream: false}
%s`, rs.Addr, ns.URL, run, e.stream, kc.Brokers[0], topic, rmq.URL, e.queue, ns.URL, extra)
	e.d = startDaemonBin(t, bin, e.cfg, env...)
	return e
}

// publish puts one message with ID id on the ingest of kind, with x-delay
// delay and the headers kv (name, value pairs).
func (e *identityEnv) publish(kind, id, body, delay string, kv ...string) {
	e.t.Helper()
	e.publishAll(kind, [][]string{append([]string{"x-message-id", id, "x-delay", delay, "body", body}, kv...)})
}

// publishAll publishes messages as fast as the broker takes them; each is
// name, value pairs, "body" naming the body.
func (e *identityEnv) publishAll(kind string, msgs [][]string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch kind {
	case "nats":
		var acks []jetstream.PubAckFuture
		for _, kv := range msgs {
			m := nats.NewMsg("ident." + strings.TrimPrefix(e.stream, "IDENT_") + ".m")
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == "body" {
					m.Data = []byte(kv[i+1])
				} else {
					m.Header.Set(kv[i], kv[i+1])
				}
			}
			f, err := e.js.PublishMsgAsync(m)
			if err != nil {
				e.t.Fatal(err)
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				e.t.Fatal(err)
			case <-ctx.Done():
				e.t.Fatal("no PubAck")
			}
		}
	case "kafka":
		var batch []kafka.Message
		for _, kv := range msgs {
			var m kafka.Message
			for i := 0; i+1 < len(kv); i += 2 {
				switch kv[i] {
				case "body":
					m.Value = []byte(kv[i+1])
				case "time":
					at, _ := time.Parse(time.RFC3339Nano, kv[i+1])
					m.Time = at
				default:
					m.Headers = append(m.Headers, kafka.Header{Key: kv[i], Value: []byte(kv[i+1])})
				}
			}
			batch = append(batch, m)
		}
		if err := e.kw.WriteMessages(ctx, batch...); err != nil {
			e.t.Fatal(err)
		}
	case "rabbit":
		var confirms []*amqp.DeferredConfirmation
		for _, kv := range msgs {
			p := amqp.Publishing{Headers: amqp.Table{}}
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == "body" {
					p.Body = []byte(kv[i+1])
				} else {
					p.Headers[kv[i]] = kv[i+1]
				}
			}
			c, err := e.ch.PublishWithDeferredConfirmWithContext(ctx, "", e.queue, false, false, p)
			if err != nil {
				e.t.Fatal(err)
			}
			confirms = append(confirms, c)
		}
		for _, c := range confirms {
			if ok, err := c.WaitContext(ctx); !ok || err != nil {
				e.t.Fatalf("rabbitmq confirm: %v %v", ok, err)
			}
		}
	}
}

// waitFired waits until every "<kind> <id>" of want has fired as many times
// as want says, and returns what fired.
func (e *identityEnv) waitFired(timeout time.Duration, want map[string]int) map[string][]string {
	e.t.Helper()
	deadline := time.After(timeout)
	for {
		e.mu.Lock()
		done := true
		for k, n := range want {
			if len(e.fired[k]) < n {
				done = false
			}
		}
		got := map[string][]string{}
		for k, v := range e.fired {
			got[k] = append([]string(nil), v...)
		}
		e.mu.Unlock()
		if done {
			return got
		}
		select {
		case <-e.seen:
		case <-deadline:
			missing := 0
			for k, n := range want {
				missing += max(0, n-len(got[k]))
			}
			e.t.Fatalf("%d fires missing after %v", missing, timeout)
		}
	}
}

// ingested is delaybridge_ingest_messages_total of ingest and result.
func (e *identityEnv) ingested(ingest, result string) float64 {
	v, _ := metricValue(e.d.metrics(), "delaybridge_ingest_messages_total", map[string]string{"ingest": ingest, "result": result})
	return v
}

// TestNewPublishOfADeliveredIDFiresAgain: a message is delivered; a new
// publish with its ID fires again, with and without x-delay-replace, on
// every ingest, RabbitMQ's (no publish time) too: such a message is not a
// duplicate for the dedupe window.
func TestNewPublishOfADeliveredIDFiresAgain(t *testing.T) {
	e := newIdentityEnv(t, "")
	for _, kind := range identityKinds {
		id := kind + "-again"
		e.publish(kind, id, "1", "20")
		e.waitFired(30*time.Second, map[string]int{kind + " " + id: 1})
		e.publish(kind, id, "2", "20")
		e.waitFired(30*time.Second, map[string]int{kind + " " + id: 2})
		e.publish(kind, id, "3", "20", "x-delay-replace", "true")
		got := e.waitFired(30*time.Second, map[string]int{kind + " " + id: 3})
		if b := strings.Join(got[kind+" "+id], ","); b != "1,2,3" {
			t.Errorf("%s: fired %s, want 1,2,3", kind, b)
		}
	}
	for _, kind := range identityKinds {
		if n := e.ingested(kind, "duplicate"); n != 0 {
			t.Errorf("%s: %v messages taken for duplicates", kind, n)
		}
	}
}

// TestRereadAfterKill9IsADuplicate: the daemon is killed (SIGKILL) after it
// parked and delivered a message but before it acknowledged it to the
// ingest (the acknowledgements are held: a faultinject binary); the broker
// delivers the message again to the next daemon, which acknowledges it as
// a duplicate (dedupe window) and does not publish it again.
func TestRereadAfterKill9IsADuplicate(t *testing.T) {
	bin := testenv.BuildTagged(t, "faultinject")
	e := newIdentityEnvBin(t, bin, "", "DELAYBRIDGE_FAULT_HOLD_ACKS=10m")
	want := map[string]int{}
	for _, kind := range identityKinds {
		e.publish(kind, kind+"-kill", "once", "0")
		want[kind+" "+kind+"-kill"] = 1
	}
	e.waitFired(30*time.Second, want)
	e.d.proc.Kill()
	<-e.d.proc.Done()
	e.d.env = nil // the next one acknowledges
	e.d.bin = testenv.Build(t)
	e.d.start()
	testenv.Eventually(t, 60*time.Second, func() bool {
		for _, kind := range identityKinds {
			if e.ingested(kind, "duplicate") < 1 {
				return false
			}
		}
		return true
	}, "the re-reads were not all acknowledged as duplicates")
	for _, kind := range identityKinds {
		if n := e.ingested(kind, "parked"); n != 0 {
			t.Errorf("%s: the re-read was parked again (%v)", kind, n)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, bodies := range e.fired {
		if len(bodies) != 1 {
			t.Errorf("%s fired %d times", k, len(bodies))
		}
	}
}

// TestRabbitRedeliveryOfANewPublishFires: a message fires; the same job is
// published again (same ID, same body), and the broker delivers it flagged
// redelivered because another consumer returned it (a nack with requeue):
// this daemon never parked that delivery, so it is a new message and
// fires again, although its content matches the delivered one's. A genuine
// re-read is
// TestRereadAfterKill9IsADuplicate.
func TestRabbitRedeliveryOfANewPublishFires(t *testing.T) {
	e := newIdentityEnv(t, "")
	const id = "rabbit-job"
	e.publish("rabbit", id, "job", "20")
	e.waitFired(30*time.Second, map[string]int{"rabbit " + id: 1})
	e.d.stop() // the next delivery goes to another consumer first

	e.publish("rabbit", id, "job", "20")
	var d amqp.Delivery
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		var err error
		d, ok, err = e.ch.Get(e.queue, false)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}, "the second publish never reached the queue")
	if err := d.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil); err != nil { // a synchronous method: the nack is processed
		t.Fatal(err)
	}
	e.d.start()
	got := e.waitFired(30*time.Second, map[string]int{"rabbit " + id: 2})
	if b := strings.Join(got["rabbit "+id], ","); b != "job,job" {
		t.Errorf("fired %s, want job,job", b)
	}
	if n := e.ingested("rabbit", "duplicate"); n != 0 {
		t.Errorf("%v messages taken for duplicates", n)
	}
}

// TestReplacementInTheSameMillisecondWins: 1,000 originals each followed at
// once by its x-delay-replace replacement (most pairs in the same
// millisecond), on every ingest: only the replacement fires, every time.
// Versions compared in whole milliseconds would lose most replacements.
//
// The delay is 10 s: an original parked once its delay has passed (an
// ingest that lags that far behind its producer) fires before its
// replacement is read, as it should, and the test would blame the daemon.
// With 3 s a busy make test can lose a Kafka pair of 1,000 that way, with
// no error in the daemon's log; nothing else fires an original first.
func TestReplacementInTheSameMillisecondWins(t *testing.T) {
	const pairs = 1000
	e := newIdentityEnv(t, "")
	want := map[string]int{}
	for _, kind := range identityKinds {
		var msgs [][]string
		for i := 0; i < pairs; i++ {
			id := fmt.Sprintf("%s-pair-%d", kind, i)
			msgs = append(msgs,
				[]string{"x-message-id", id, "x-delay", "10000", "body", "original"},
				[]string{"x-message-id", id, "x-delay", "10000", "x-delay-replace", "true", "body", "replacement"})
			want[kind+" "+id] = 1
		}
		e.publishAll(kind, msgs)
	}
	got := e.waitFired(2*time.Minute, want)
	for _, kind := range identityKinds {
		var lost []string
		for i := 0; i < pairs; i++ {
			id := fmt.Sprintf("%s-pair-%d", kind, i)
			if b := got[kind+" "+id]; len(b) != 1 || b[0] != "replacement" {
				lost = append(lost, fmt.Sprintf("%s fired %v", id, b))
			}
		}
		t.Logf("%s: %d pairs, %d replacements lost", kind, pairs, len(lost))
		if len(lost) > 0 {
			t.Errorf("%s: %d of %d replacements lost or fired twice, first: %s", kind, len(lost), pairs, strings.Join(lost[:min(5, len(lost))], "; "))
		}
	}
}

// TestKafkaRecordStampedAYearAhead: a record whose producer stamped it a
// year ahead neither holds back its later replacement (the later offset of
// the partition is the newer version) nor, once delivered, a later new
// message with its ID; its delay counts from the moment of ingest.
func TestKafkaRecordStampedAYearAhead(t *testing.T) {
	e := newIdentityEnv(t, "")
	future := time.Now().AddDate(1, 0, 0).Format(time.RFC3339Nano)
	e.publishAll("kafka", [][]string{{"x-message-id", "ahead", "x-delay", "60000", "body", "v1", "time", future}})
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, _ := e.d.get("/v1/messages/ahead", nil)
		return code == http.StatusOK
	}, "the record stamped a year ahead was not parked")
	var info struct {
		DueAt time.Time `json:"due_at"`
	}
	e.d.get("/v1/messages/ahead", &info)
	if d := time.Until(info.DueAt); d > 2*time.Minute {
		t.Fatalf("due in %v: the delay counted from the producer's clock", d)
	}
	e.publish("kafka", "ahead", "v2", "20", "x-delay-replace", "true")
	e.waitFired(30*time.Second, map[string]int{"kafka ahead": 1})
	e.publish("kafka", "ahead", "v3", "20")
	got := e.waitFired(30*time.Second, map[string]int{"kafka ahead": 2})
	if b := strings.Join(got["kafka ahead"], ","); b != "v2,v3" {
		t.Fatalf("fired %s, want v2,v3", b)
	}
}

// TestCeleryStyleRetries: tasks as Celery publishes them, each retried with
// its own task ID as x-message-id (a new message, with a retries header,
// due after its countdown), through a RabbitMQ ingest: every retry runs.
// A retry of a delivered ID is a new message, not a duplicate.
func TestCeleryStyleRetries(t *testing.T) {
	const tasks = 200
	e := newIdentityEnv(t, "")
	want := map[string]int{}
	var msgs [][]string
	for i := 0; i < tasks; i++ {
		id := fmt.Sprintf("%08x-task-%d", i*7919, i)
		msgs = append(msgs, []string{"x-message-id", id, "x-delay", "10", "retries", "0", "body", `{"task":"tasks.add","args":[1,2]}`})
		want["rabbit "+id] = i%3 + 1 // task i fails i%3 times, then succeeds
	}
	e.publishAll("rabbit", msgs)
	// The worker: every run of a task that should fail is retried at once,
	// as Celery's Task.retry publishes the task again with retries+1.
	done := map[string]int{}
	for {
		e.mu.Lock()
		var retry [][]string
		finished := 0
		for k, n := range want {
			runs := len(e.fired[k])
			id := strings.TrimPrefix(k, "rabbit ")
			if runs < n && runs > done[id] {
				done[id] = runs
				retry = append(retry, []string{"x-message-id", id, "x-delay", "10", "retries", strconv.Itoa(runs), "body", `{"task":"tasks.add","args":[1,2]}`})
			}
			if runs >= n {
				finished++
			}
		}
		e.mu.Unlock()
		if finished == tasks {
			break
		}
		if len(retry) > 0 {
			e.publishAll("rabbit", retry)
			continue
		}
		select {
		case <-e.seen:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d tasks finished; the retries of the others never ran", finished, tasks)
		}
	}
	got := e.waitFired(time.Second, want)
	runs := 0
	for k, n := range want {
		if len(got[k]) != n {
			t.Errorf("%s ran %d times, want %d", k, len(got[k]), n)
		}
		runs += len(got[k])
	}
	t.Logf("%d tasks, %d runs (every retry ran)", tasks, runs)
}

// TestFractionalDelays: an x-delay that is an AMQP double or float (as
// amqplib sends 0.1*3*1000, and pika a Python float) or a decimal string
// with a fraction is accepted and rounded up to the next millisecond
// (docs/reference.md: fractional delays); before, each went dead as "neither
// integer milliseconds nor a duration".
func TestFractionalDelays(t *testing.T) {
	e := newIdentityEnv(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for id, delay := range map[string]any{"double": 0.1 * 3 * 1000, "float": float32(1500.5), "string": "1500.5"} {
		c, err := e.ch.PublishWithDeferredConfirmWithContext(ctx, "", e.queue, false, false,
			amqp.Publishing{Headers: amqp.Table{"x-delay": delay, "x-message-id": "frac-" + id}, Body: []byte(id)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("confirm: %v %v", ok, err)
		}
	}
	e.waitFired(30*time.Second, map[string]int{"rabbit frac-double": 1, "rabbit frac-float": 1, "rabbit frac-string": 1})
	if dead := e.d.dead(); len(dead) != 0 {
		t.Fatalf("dead: %+v", dead)
	}
}
