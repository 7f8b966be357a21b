//go:build bench

package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// brokerPairing is a group of end-to-end scenarios between other brokers:
// the rate runs (-rates) and the maximum-rate run (-n), as for NATS.
type brokerPairing struct {
	group   string // -only name
	pairing string
	run     func(t *testing.T, e *env, l natsLoad, s *Scenario) // fills s
}

var brokerPairings = []brokerPairing{
	{"kafka-rabbit", "Kafka -> RabbitMQ", runKafkaToRabbit},
	{"rabbit-kafka", "RabbitMQ -> Kafka", runRabbitToKafka},
}

// runGroup runs the pairing's loads. When the daemon of this build refuses
// an adapter ("not available in this build"), every load of the pairing is
// reported as pending, not measured.
func (p brokerPairing) runGroup(t *testing.T, e *env, rep *Report) {
	loads := []natsLoad{}
	for _, r := range parseRates(t) {
		loads = append(loads, natsLoad{kind: "rate", n: int(r * flagRateD.Seconds()), rate: r, delay: *flagDelay})
	}
	loads = append(loads, natsLoad{kind: "max", n: *flagN, delay: *flagDelay})
	for i, l := range loads {
		s := &Scenario{Pairing: p.pairing, System: "delaybridge", Load: l.name(), Kind: l.kind,
			Messages: l.n, TargetRate: l.rate, Delay: l.delay.String(), BodyBytes: *flagBody}
		t.Logf("== %s %s: %s", s.Pairing, s.System, s.Load)
		p.run(t, e, l, s)
		rep.add(t, s)
		if s.Status == "pending" {
			for _, l := range loads[i+1:] {
				rep.add(t, &Scenario{Pairing: p.pairing, System: "delaybridge", Load: l.name(), Kind: l.kind,
					Messages: l.n, TargetRate: l.rate, Status: "pending", Notes: s.Notes})
			}
			return
		}
	}
}

// watchParked polls the daemon's delaybridge_ingest_messages_total
// {result="parked"} until it reaches n and returns a function that stops
// polling and returns that moment (zero if never reached).
func watchParked(t *testing.T, d *daemon, n int) func() time.Time {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan time.Time, 1)
	go func() {
		for ctx.Err() == nil {
			if d.metrics(t)["ingest.parked"] >= float64(n) {
				done <- time.Now()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		done <- time.Time{}
	}()
	return func() time.Time { cancel(); return <-done }
}

// startPairingDaemon starts the daemon; a build without one of the adapters
// makes the scenario pending.
func startPairingDaemon(t *testing.T, e *env, cfg string, s *Scenario) *daemon {
	d, out := e.startDaemon(t, cfg)
	if d != nil {
		return d
	}
	if i := strings.Index(out, "not available in this build"); i >= 0 {
		line := out[max(0, strings.LastIndex(out[:i], "\n")+1):]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		s.Status = "pending"
		s.note("not measured: this build of the daemon lacks an adapter of the pairing (pkg/daemon/build.go): %s", strings.TrimSpace(line))
		return nil
	}
	s.Status = "failed"
	s.note("daemon exited at start: %s", lastBytes(out, 600))
	return nil
}

var (
	kafkaOnce sync.Once
	kafkaC    *testenv.KafkaCluster
)

func sharedKafka(t *testing.T) *testenv.KafkaCluster {
	kafkaOnce.Do(func() { kafkaC = testenv.Kafka(t, testenv.WithoutPersistence()) })
	return kafkaC
}

// pace calls send(from, to) for consecutive ranges of [0, n) as fast as
// possible (rate 0) or at rate msg/s, in chunks of at most chunk.
func pace(n int, rate float64, chunk int, send func(from, to int)) (first, last time.Time) {
	first = time.Now()
	for i := 0; i < n; {
		to := min(n, i+chunk)
		if rate > 0 {
			allowed := int(rate*time.Since(first).Seconds()) + 1
			if allowed <= i {
				time.Sleep(500 * time.Microsecond)
				continue
			}
			to = min(to, allowed)
		}
		send(i, to)
		i = to
	}
	return first, time.Now()
}

// runKafkaToRabbit: records produced to a Kafka topic (kfake, in this
// process) with x-delay, delivered by the daemon to a RabbitMQ classic queue.
// RabbitMQ has no millisecond broker timestamp, so lateness is the
// consumer's receive time minus the due time (it includes delivery to the
// consumer).
func runKafkaToRabbit(t *testing.T, e *env, l natsLoad, s *Scenario) {
	ctx := context.Background()
	kc := sharedKafka(t)
	rb := testenv.RabbitMQ(t)
	seq := nextPrefix(l.kind)
	topic, queue := "delayed-"+seq, "bench.fired."+seq
	kc.CreateTopic(t, topic, 4)
	if err := e.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	conn, ch := amqpChannel(t, rb.URL)
	defer conn.Close()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()

	d := startPairingDaemon(t, e, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: bench, shards: 16}
admin: {listen: "%%ADMIN%%"}
ingest:
  - name: in
    kafka: {brokers: ["%s"], topic: %s, group: bench-%s, start_offset: first}
    route: {sink: rabbit, destination: "%s"}
sinks:
  - name: rabbit
    rabbitmq: {url: "%s", exchange: ""}
`, e.redis.Addr, strings.Join(kc.Brokers, `", "`), topic, seq, queue, rb.URL), s)
	if d == nil {
		return
	}
	rec := newRecorder(l.n, seq)
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	_ = cch.Qos(2000, 0, false)
	deliveries, err := cch.Consume(queue, "bench", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for dl := range deliveries {
			now := time.Now()
			id, _ := dl.Headers[envelope.HeaderMessageID].(string)
			dueS, _ := dl.Headers[envelope.HeaderDueAt].(string)
			if due, err := time.Parse(time.RFC3339Nano, dueS); err == nil {
				rec.record(id, now, due)
			}
		}
	}()
	parked := watchParked(t, d, l.n)
	cpu := startCPU(d.proc.Pid, e.rdb)
	w := &kafka.Writer{Addr: kafka.TCP(kc.Brokers...), Topic: topic, RequiredAcks: kafka.RequireAll,
		BatchSize: 1000, BatchTimeout: time.Millisecond, Balancer: &kafka.RoundRobin{},
		Transport: &kafka.Transport{}} // not the shared default: its metadata cache misses topics created since
	defer w.Close()
	body := make([]byte, *flagBody)
	delayMS := []byte(strconv.FormatInt(l.delay.Milliseconds(), 10))
	first, last := pace(l.n, l.rate, 1000, func(from, to int) {
		batch := make([]kafka.Message, 0, to-from)
		for i := from; i < to; i++ {
			batch = append(batch, kafka.Message{Value: body, Headers: []kafka.Header{
				{Key: "x-message-id", Value: []byte(msgID(seq, i))}, {Key: "x-delay", Value: delayMS}}})
		}
		var err error
		for try := 0; try < 5; try++ {
			if err = w.WriteMessages(ctx, batch...); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			if s.PublishErrors == 0 {
				s.note("first produce error: %v", err)
			}
			s.PublishErrors += int64(to - from)
		}
	})
	all := rec.wait(30*time.Second, time.Duration(l.n/500)*time.Second+2*time.Minute)
	parkedAt := parked()
	cpu.stop(s)
	if !parkedAt.IsZero() {
		s.ParkSeconds = parkedAt.Sub(first).Seconds()
		s.ParkRate = float64(l.n) / s.ParkSeconds
	}
	s.DaemonMetrics = d.metrics(t)
	_ = cch.Close()
	d.stop(t)
	rec.fill(s)
	s.setPublish(&pubResult{first: first, last: last})
	s.setEndToEnd(first, rec)
	s.finish(all)
}

// runRabbitToKafka: messages published with confirms (1000 in flight) to a
// RabbitMQ classic queue with x-delay, delivered by the daemon to a Kafka
// topic. Lateness is the Kafka record timestamp (set by the daemon's
// producer when it publishes) minus the due time.
func runRabbitToKafka(t *testing.T, e *env, l natsLoad, s *Scenario) {
	ctx := context.Background()
	kc := sharedKafka(t)
	rb := testenv.RabbitMQ(t)
	seq := nextPrefix(l.kind)
	queue, topic := "bench.delayed."+seq, "fired-"+seq
	kc.CreateTopic(t, topic, 4)
	if err := e.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	conn, ch := amqpChannel(t, rb.URL)
	defer conn.Close()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()

	d := startPairingDaemon(t, e, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: bench, shards: 16}
admin: {listen: "%%ADMIN%%"}
ingest:
  - name: in
    rabbitmq: {url: "%s", queue: "%s"}
    route: {sink: kafka, destination: %s}
sinks:
  - name: kafka
    kafka: {brokers: ["%s"]}
`, e.redis.Addr, rb.URL, queue, topic, strings.Join(kc.Brokers, `", "`)), s)
	if d == nil {
		return
	}
	rec := newRecorder(l.n, seq)
	defer readKafka(kc, topic, 4, rec, true)()
	parked := watchParked(t, d, l.n)
	cpu := startCPU(d.proc.Pid, e.rdb)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, *flagBody)
	delayMS := strconv.FormatInt(l.delay.Milliseconds(), 10)
	const window = 1000
	pending := make([]*amqp.DeferredConfirmation, window)
	first, last := pace(l.n, l.rate, 100, func(from, to int) {
		for i := from; i < to; i++ {
			if dc := pending[i%window]; dc != nil && !dc.Wait() {
				s.PublishErrors++
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
				Headers: amqp.Table{"x-message-id": msgID(seq, i), "x-delay": delayMS}, Body: body, DeliveryMode: amqp.Persistent})
			if err != nil {
				s.PublishErrors++
			}
			pending[i%window] = dc
		}
	})
	for _, dc := range pending {
		if dc != nil && !dc.Wait() {
			s.PublishErrors++
		}
	}
	last = time.Now()
	all := rec.wait(30*time.Second, time.Duration(l.n/500)*time.Second+2*time.Minute)
	parkedAt := parked()
	cpu.stop(s)
	if !parkedAt.IsZero() {
		s.ParkSeconds = parkedAt.Sub(first).Seconds()
		s.ParkRate = float64(l.n) / s.ParkSeconds
	}
	s.DaemonMetrics = d.metrics(t)
	d.stop(t)
	rec.fill(s)
	s.setPublish(&pubResult{first: first, last: last})
	s.setEndToEnd(first, rec)
	s.finish(all)
}

func amqpChannel(t *testing.T, url string) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn, ch
}
