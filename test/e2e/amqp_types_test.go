package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// rabbitEnv is a daemon with a RabbitMQ ingest routed to a RabbitMQ sink
// (and a NATS sink that x-delay-sink may choose), with encryption at rest
// on, and a consumer of the sink's queue.
type rabbitEnv struct {
	t       *testing.T
	rabbit  *testenv.RabbitNode
	redis   *testenv.RedisServer
	nats    *testenv.NATSServer
	in, out string // queues
	ch      *amqp.Channel
	d       *daemon

	mu   sync.Mutex
	got  map[string]amqp.Delivery // by x-message-id
	at   map[string]time.Time     // when it arrived
	natz map[string]nats.Header   // NATS sink copies by x-message-id
}

const (
	typesPrefix = "amqptypes"
	typesKeyID  = "k1"
)

// newRabbitEnv starts the servers and, unless before is set, the daemon;
// before runs first (to leave data in Redis as an older release would).
func newRabbitEnv(t *testing.T, name string, before func(e *rabbitEnv)) *rabbitEnv {
	t.Helper()
	e := &rabbitEnv{t: t, rabbit: testenv.RabbitMQ(t), redis: testenv.Redis(t), nats: testenv.NATS(t),
		in: name + "-in", out: name + "-out",
		got: map[string]amqp.Delivery{}, at: map[string]time.Time{}, natz: map[string]nats.Header{}}
	conn, err := amqp.Dial(e.rabbit.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if e.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := e.ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{e.in, e.out} {
		if _, err := e.ch.QueueDelete(q, false, false, false); err != nil {
			t.Fatal(err)
		}
		if _, err := e.ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := cch.Consume(e.out, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range deliveries {
			id, _ := d.Headers[envelope.HeaderMessageID].(string)
			e.mu.Lock()
			if _, dup := e.got[id]; !dup {
				e.got[id], e.at[id] = d, time.Now().Round(0)
			}
			e.mu.Unlock()
		}
	}()

	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	stream := strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{name + ".>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		e.mu.Lock()
		e.natz[m.Headers().Get(envelope.HeaderMessageID)] = m.Headers()
		e.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)

	if before != nil {
		before(e)
	}
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	e.d = startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: %s}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: rabbit-in
    rabbitmq: {url: "%s", queue: %s}
    route: {sink: rabbit, destination: %s, allow_override: true}
sinks:
  - name: rabbit
    rabbitmq: {url: "%[3]s", exchange: ""}
  - name: nats
    nats: {url: "%[6]s", jetstream: true}
`, e.redis.Addr, typesPrefix, e.rabbit.URL, e.in, e.out, e.nats.URL)+
		encryptionSection(typesKeyID, `{id: k1, key: "${TYPES_KEY}"}`), "TYPES_KEY="+key)
	return e
}

// publish sends one message to the ingest queue as a plugin user's client
// does, with typed headers.
func (e *rabbitEnv) publish(p amqp.Publishing) {
	e.t.Helper()
	p.DeliveryMode = amqp.Persistent
	dc, err := e.ch.PublishWithDeferredConfirm("", e.in, true, false, p)
	if err != nil {
		e.t.Fatal(err)
	}
	if !dc.Wait() {
		e.t.Fatal("the broker nacked a publish")
	}
}

// wait returns the delivery of the message with x-message-id id and when it
// arrived.
func (e *rabbitEnv) wait(id string) (amqp.Delivery, time.Time) {
	e.t.Helper()
	var d amqp.Delivery
	var at time.Time
	testenv.Eventually(e.t, 30*time.Second, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		var ok bool
		d, ok = e.got[id]
		at = e.at[id]
		return ok
	}, "%s not delivered to the RabbitMQ sink", id)
	return d, at
}

func (e *rabbitEnv) waitNATS(id string) nats.Header {
	e.t.Helper()
	var h nats.Header
	testenv.Eventually(e.t, 30*time.Second, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		h = e.natz[id]
		return h != nil
	}, "%s not delivered to the NATS sink", id)
	return h
}

// fieldDiff lists where got differs from want in value or Go type (hence in
// AMQP field type), nested tables and arrays included. Floats compare by
// bits, timestamps by instant.
func fieldDiff(path string, got, want any) []string {
	bad := func() []string {
		return []string{fmt.Sprintf("%s: got %#v (%T), sent %#v (%T)", path, got, got, want, want)}
	}
	switch w := want.(type) {
	case amqp.Table:
		g, ok := got.(amqp.Table)
		if !ok {
			return bad()
		}
		var diffs []string
		keys := make([]string, 0, len(w)+len(g))
		for k := range w {
			keys = append(keys, k)
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			gv, gok := g[k]
			wv, wok := w[k]
			if gok != wok {
				diffs = append(diffs, fmt.Sprintf("%s.%s: present %v, sent %v", path, k, gok, wok))
				continue
			}
			diffs = append(diffs, fieldDiff(path+"."+k, gv, wv)...)
		}
		return diffs
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return bad()
		}
		var diffs []string
		for i := range w {
			diffs = append(diffs, fieldDiff(fmt.Sprintf("%s[%d]", path, i), g[i], w[i])...)
		}
		return diffs
	case []byte:
		if g, ok := got.([]byte); !ok || !bytes.Equal(g, w) {
			return bad()
		}
	case time.Time:
		if g, ok := got.(time.Time); !ok || !g.Equal(w) {
			return bad()
		}
	case float32:
		if g, ok := got.(float32); !ok || math.Float32bits(g) != math.Float32bits(w) {
			return bad()
		}
	case float64:
		if g, ok := got.(float64); !ok || math.Float64bits(g) != math.Float64bits(w) {
			return bad()
		}
	default:
		if got != want {
			return bad()
		}
	}
	return nil
}

// everyAMQPType is a header table with every field type amqp091-go can
// carry, at the edges of their ranges, nested in tables and arrays with
// mixed types and voids.
func everyAMQPType() amqp.Table {
	ts := time.Unix(1795000000, 0)
	return amqp.Table{
		"x-i8":     int8(math.MinInt8),
		"x-u8":     uint8(math.MaxUint8),
		"x-i16":    int16(math.MinInt16),
		"x-u16":    uint16(math.MaxUint16),
		"x-i32":    int32(math.MinInt32),
		"x-num":    int32(42), // a Python int, as pika and py-amqp send it
		"x-u32":    uint32(math.MaxUint32),
		"x-i64":    int64(math.MaxInt64),
		"x-bool":   true,
		"x-false":  false,
		"x-f32":    float32(-1.25),
		"x-f64":    math.SmallestNonzeroFloat64,
		"x-dec":    amqp.Decimal{Scale: 2, Value: -12345},
		"x-time":   ts,
		"x-bytes":  []byte{0, 1, 0xfe, 0xff},
		"x-empty":  []byte{},
		"x-str":    "héllo",
		"x-void":   nil,
		"x-array":  []any{int32(1), "two", nil, 3.5, int64(-4), uint8(5), []any{nil, false, []byte("b")}, amqp.Table{"k": uint16(7)}},
		"x-none":   []any{},
		"x-nested": amqp.Table{"i8": int8(-1), "t": ts, "d": amqp.Decimal{Scale: 1, Value: 15}, "deeper": amqp.Table{"a": []any{int16(-2), nil}, "v": nil}, "empty": amqp.Table{}},
	}
}

// TestRabbitToRabbitKeepsHeaderTypes: a message published with a header of
// every AMQP field type and the properties RabbitMQ's delayed exchange kept
// goes through the real binary (parked sealed in Redis) and arrives on time
// with each header's value and type, nested ones included, and the
// properties; routed to NATS, the same message carries the string forms and
// the properties as headers.
func TestRabbitToRabbitKeepsHeaderTypes(t *testing.T) {
	e := newRabbitEnv(t, "types", nil)
	sent := everyAMQPType()
	ts := time.Unix(1795000000, 0)
	props := func(id string, delay int32, h amqp.Table) amqp.Publishing {
		headers := amqp.Table{"x-delay": delay, "x-message-id": id}
		for k, v := range h {
			headers[k] = v
		}
		return amqp.Publishing{
			Headers: headers, Body: []byte("body of " + id),
			ContentType: "application/json", ContentEncoding: "utf-8", CorrelationId: "corr-" + id,
			ReplyTo: "replies", Expiration: "600000", Priority: 7, Type: "my.type", AppId: "my-app",
			UserId: "guest", Timestamp: ts,
		}
	}
	// A copy that stays parked shows what Redis holds: sealed.
	secret := amqp.Table{"x-nested": amqp.Table{"secret": []byte("TYPED-SECRET")}}
	e.publish(props("types-parked", 3600_000, secret))
	published := time.Now().Round(0)
	e.publish(props("types-1", 1500, sent))
	toNATS := props("types-nats", 1500, sent)
	toNATS.Headers["x-delay-sink"], toNATS.Headers["x-delay-destination"] = "nats", "types.out"
	e.publish(toNATS)

	rdb := e.redis.Client()
	testenv.Eventually(t, 15*time.Second, func() bool {
		n, _ := rdb.HExists(context.Background(), fmt.Sprintf("%s:{%d}:pool", typesPrefix, store.ShardOf("types-parked", 16)), "types-parked").Result()
		return n
	}, "types-parked not parked")
	blob, err := rdb.HGet(context.Background(), fmt.Sprintf("%s:{%d}:pool", typesPrefix, store.ShardOf("types-parked", 16)), "types-parked").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if k, sealed, err := envelope.SealedKeyID(blob); err != nil || !sealed || k != typesKeyID {
		t.Fatalf("parked message sealed %v with %q (%v)", sealed, k, err)
	}
	for _, s := range []string{"TYPED-SECRET", "corr-types-parked", "my-app", "application/json"} {
		if bytes.Contains(blob, []byte(s)) {
			t.Errorf("%q in clear in Redis", s)
		}
	}

	d, at := e.wait("types-1")
	if due := published.Add(1500 * time.Millisecond); at.Before(due) {
		t.Errorf("arrived at %v, before %v", at, due)
	}
	want := amqp.Table{}
	for k, v := range sent {
		want[k] = v
	}
	for _, k := range []string{envelope.HeaderMessageID, envelope.HeaderDueAt, envelope.HeaderAttempt} {
		v, ok := d.Headers[k].(string)
		if !ok {
			t.Errorf("%s = %#v (%T), want a string", k, d.Headers[k], d.Headers[k])
		}
		want[k] = v
	}
	if want[envelope.HeaderMessageID] != "types-1" || want[envelope.HeaderAttempt] != "1" {
		t.Errorf("x-message-id %v, x-delaybridge-attempt %v", want[envelope.HeaderMessageID], want[envelope.HeaderAttempt])
	}
	for _, diff := range fieldDiff("headers", d.Headers, want) {
		t.Error(diff)
	}
	gotProps := []any{d.ContentType, d.ContentEncoding, d.CorrelationId, d.ReplyTo, d.Expiration,
		d.Priority, d.Type, d.AppId, d.UserId, d.Timestamp.Unix(), d.MessageId, d.DeliveryMode, string(d.Body)}
	wantProps := []any{"application/json", "utf-8", "corr-types-1", "replies", "600000",
		uint8(7), "my.type", "my-app", "guest", ts.Unix(), "types-1", amqp.Persistent, "body of types-1"}
	if fmt.Sprint(gotProps) != fmt.Sprint(wantProps) {
		t.Errorf("properties and body\n got %v\nwant %v", gotProps, wantProps)
	}

	// RabbitMQ -> NATS: the string forms, and the properties as headers.
	h := e.waitNATS("types-nats")
	for k, v := range map[string]string{
		"x-num": "42", "x-bool": "true", "x-i64": "9223372036854775807", "x-dec": "-123.45",
		"x-time": "2026-11-18T11:06:40Z", "x-void": "", "x-none": "[]",
		"x-array":      `[1,"two",null,3.5,-4,5,[null,false,"b"],{"k":7}]`,
		"content-type": "application/json", "content-encoding": "utf-8", "correlation-id": "corr-types-nats",
		"reply-to": "replies", "expiration": "600000", "priority": "7", "type": "my.type", "app-id": "my-app",
		"user-id": "guest", "timestamp": "2026-11-18T11:06:40Z",
	} {
		if got, ok := h[k]; !ok || len(got) != 1 || got[0] != v {
			t.Errorf("NATS header %s = %q, want %q", k, got, v)
		}
	}
	e.d.stop()
}

// TestRabbitVersion1MessagesAfterUpgrade: a message parked by the release
// before typed headers (stored encoding version 1, in clear) is published by
// the current binary with the string headers it was parked with.
func TestRabbitVersion1MessagesAfterUpgrade(t *testing.T) {
	old := &envelope.Message{
		ID: "parked-before-upgrade", DueAt: time.Now().Add(-time.Second).Truncate(time.Millisecond),
		Sink: "rabbit", Destination: "upgrade-out", Ingest: "rabbit-in", IngestedAt: time.Now().Add(-time.Minute),
		Headers: envelope.Headers{{Key: "x-num", Value: "42"}, {Key: "x-bool", Value: "true"}},
		Body:    []byte("old body"),
	}
	e := newRabbitEnv(t, "upgrade", func(e *rabbitEnv) {
		blob := envelope.Encode(nil, old)
		if blob[0] != 1 {
			t.Fatalf("not the version 1 encoding: version %d", blob[0])
		}
		shard := store.ShardOf(old.ID, 16)
		keys := store.NewKeys(typesPrefix)
		ctx := context.Background()
		rdb := e.redis.Client()
		if err := rdb.HSet(ctx, keys.Pool(shard), old.ID, blob).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, keys.Due(shard), redis.Z{Score: float64(old.DueAt.UnixMilli()), Member: old.ID}).Err(); err != nil {
			t.Fatal(err)
		}
	})
	d, _ := e.wait(old.ID)
	want := amqp.Table{"x-num": "42", "x-bool": "true", envelope.HeaderMessageID: old.ID,
		envelope.HeaderDueAt: envelope.FormatTime(old.DueAt), envelope.HeaderAttempt: "1"}
	for _, diff := range fieldDiff("headers", d.Headers, want) {
		t.Error(diff)
	}
	if string(d.Body) != "old body" || d.MessageId != old.ID || d.ContentType != "" {
		t.Errorf("body %q message_id %q content_type %q", d.Body, d.MessageId, d.ContentType)
	}
	e.d.stop()
}

// celeryTask is a task message as Celery 5 sends it (task protocol 2, kombu
// and py-amqp): the headers with the AMQP types py-amqp writes, the
// properties, and the JSON body [args, kwargs, embed].
func celeryTask(id string, eta, expires time.Time) amqp.Publishing {
	body, _ := json.Marshal([]any{[]any{2, 2}, map[string]any{}, map[string]any{"callbacks": nil, "errbacks": nil, "chain": nil, "chord": nil}})
	return amqp.Publishing{
		Headers: amqp.Table{
			"x-delay":               int32(1500), // as RabbitMQ's delayed exchange users send it
			"lang":                  "py",
			"task":                  "proj.tasks.add",
			"id":                    id,
			"shadow":                nil,
			"eta":                   eta.UTC().Format("2006-01-02T15:04:05.000000-07:00"), // Python's isoformat()
			"expires":               expires.UTC().Format("2006-01-02T15:04:05.000000-07:00"),
			"group":                 nil,
			"group_index":           nil,
			"retries":               int32(2),
			"timelimit":             []any{int32(300), nil}, // [hard, soft]
			"root_id":               id,
			"parent_id":             nil,
			"argsrepr":              "(2, 2)",
			"kwargsrepr":            "{}",
			"origin":                "gen4242@worker-host",
			"ignore_result":         false,
			"replaced_task_nesting": int32(0),
			"stamped_headers":       nil,
			"stamps":                amqp.Table{},
		},
		CorrelationId:   id,
		ReplyTo:         "c0ffee-reply-queue",
		ContentType:     "application/json",
		ContentEncoding: "utf-8",
		Priority:        3,
		DeliveryMode:    amqp.Persistent,
		Body:            body,
	}
}

// celeryRequest is what a Celery worker takes from a task message.
type celeryRequest struct {
	task, id            string
	nextRetries         int32 // Task.retry: request.retries + 1
	hardLimit, softTime any   // numbers or nil
	eta, expires        time.Time
	args                []any
	kwargs              map[string]any
}

// celeryWorkerReads reads a delivery the way Celery's worker does
// (celery/worker/request.py, app/task.py), failing where Python would raise
// on a wrong type: the protocol by the task header, retries + 1,
// `time_limit, soft_time_limit = timelimit`, eta and expires through
// maybe_iso8601, stamps as a table, the body decoded by its content type
// and encoding.
func celeryWorkerReads(d amqp.Delivery) (*celeryRequest, error) {
	h := d.Headers
	r := &celeryRequest{}
	var ok bool
	if r.task, ok = h["task"].(string); !ok {
		return nil, fmt.Errorf("task header %#v (%T): not task protocol 2", h["task"], h["task"])
	}
	if r.id, ok = h["id"].(string); !ok || d.CorrelationId != r.id {
		return nil, fmt.Errorf("id %#v, correlation_id %q", h["id"], d.CorrelationId)
	}
	retries, ok := h["retries"].(int32)
	if !ok {
		return nil, fmt.Errorf("TypeError: retries %#v (%T) + 1", h["retries"], h["retries"])
	}
	r.nextRetries = retries + 1
	tl, ok := h["timelimit"].([]any)
	if !ok || len(tl) != 2 {
		return nil, fmt.Errorf("cannot unpack timelimit %#v (%T)", h["timelimit"], h["timelimit"])
	}
	for _, v := range tl {
		switch v.(type) {
		case nil, int32, int64, float64:
		default:
			return nil, fmt.Errorf("time limit %#v (%T) is not a number or None", v, v)
		}
	}
	r.hardLimit, r.softTime = tl[0], tl[1]
	for name, dst := range map[string]*time.Time{"eta": &r.eta, "expires": &r.expires} {
		switch v := h[name].(type) {
		case nil:
		case string:
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return nil, fmt.Errorf("maybe_iso8601(%s=%q): %v", name, v, err)
			}
			*dst = t
		default:
			return nil, fmt.Errorf("%s %#v (%T) is not an ISO 8601 string or None", name, v, v)
		}
	}
	for _, name := range []string{"group", "parent_id", "shadow", "group_index", "stamped_headers"} {
		if v, present := h[name]; !present || v != nil {
			return nil, fmt.Errorf("%s = %#v, want None", name, v)
		}
	}
	if _, ok := h["ignore_result"].(bool); !ok {
		return nil, fmt.Errorf("ignore_result %#v (%T) is not a bool", h["ignore_result"], h["ignore_result"])
	}
	if _, ok := h["stamps"].(amqp.Table); !ok {
		return nil, fmt.Errorf("stamps %#v (%T) is not a table", h["stamps"], h["stamps"])
	}
	if d.ContentType != "application/json" || d.ContentEncoding != "utf-8" {
		return nil, fmt.Errorf("content type %q encoding %q: kombu cannot decode the body", d.ContentType, d.ContentEncoding)
	}
	var body []json.RawMessage
	if err := json.Unmarshal(d.Body, &body); err != nil || len(body) != 3 {
		return nil, fmt.Errorf("body %q is not [args, kwargs, embed]: %v", d.Body, err)
	}
	if err := json.Unmarshal(body[0], &r.args); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(body[1], &r.kwargs); err != nil {
		return nil, err
	}
	return r, nil
}

// TestCeleryTaskThroughRabbitMQ: a Celery task message (protocol 2)
// published with x-delay, as to the delayed exchange, reaches a worker
// behind delaybridge that reads it as Celery does: retries + 1, the time
// limits, eta and expires, the reply-to and correlation ID, all typed as
// sent.
func TestCeleryTaskThroughRabbitMQ(t *testing.T) {
	e := newRabbitEnv(t, "celery", nil)
	id := "7d7d2bd0-8a2b-4c62-9f0e-celery000001"
	eta := time.Now().Add(1500 * time.Millisecond).Truncate(time.Microsecond)
	expires := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	task := celeryTask(id, eta, expires)
	task.MessageId = "" // Celery sends none: delaybridge generates the message ID
	e.publish(task)

	var d amqp.Delivery
	var at time.Time
	testenv.Eventually(t, 30*time.Second, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, x := range e.got {
			if x.CorrelationId == id {
				d, at = x, e.at[x.Headers[envelope.HeaderMessageID].(string)]
				return true
			}
		}
		return false
	}, "the Celery task was not delivered")

	r, err := celeryWorkerReads(d)
	if err != nil {
		t.Fatalf("the worker cannot read the task: %v", err)
	}
	if r.task != "proj.tasks.add" || r.nextRetries != 3 || r.hardLimit != int32(300) || r.softTime != nil {
		t.Errorf("task %q, retries+1 = %d, time limits %#v %#v", r.task, r.nextRetries, r.hardLimit, r.softTime)
	}
	if !r.eta.Equal(eta) || !r.expires.Equal(expires) {
		t.Errorf("eta %v expires %v, sent %v %v", r.eta, r.expires, eta, expires)
	}
	if at.Before(eta) { // eta was taken just before the publish, due counts from the ingest
		t.Errorf("delivered at %v, before the eta %v", at, eta)
	}
	if !at.Before(r.expires) {
		t.Errorf("delivered at %v, after expires %v: the worker would revoke it", at, r.expires)
	}
	if fmt.Sprint(r.args, r.kwargs) != "[2 2] map[]" {
		t.Errorf("args %v kwargs %v", r.args, r.kwargs)
	}
	if d.ReplyTo != "c0ffee-reply-queue" || d.Priority != 3 || d.DeliveryMode != amqp.Persistent {
		t.Errorf("reply_to %q priority %d delivery_mode %d", d.ReplyTo, d.Priority, d.DeliveryMode)
	}
	// Every header as sent, value and type, without x-delay.
	want := task.Headers
	delete(want, "x-delay")
	for _, k := range []string{envelope.HeaderMessageID, envelope.HeaderDueAt, envelope.HeaderAttempt} {
		want[k] = d.Headers[k]
	}
	for _, diff := range fieldDiff("headers", d.Headers, want) {
		t.Error(diff)
	}
	e.d.stop()
}
