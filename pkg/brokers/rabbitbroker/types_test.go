package rabbitbroker_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/seal"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// park stores m the way the store does (sealed when sealer is set) and
// reads it back, as the scheduler does when it is due.
func park(t testing.TB, m *envelope.Message, sealer envelope.Sealer) (*envelope.Message, []byte) {
	t.Helper()
	c := envelope.Codec{Sealer: sealer}
	blob := c.Encode(nil, m)
	back, err := c.Decode(m.ID, blob)
	if err != nil {
		t.Fatalf("decode %s: %v", m.ID, err)
	}
	return back, blob
}

// TestHeaderTypesAndPropertiesSurvive sends a message with a header of every
// AMQP field type and the kept properties through the Source, the stored
// encoding (sealed) and the Sink, on a real broker: what the consumer gets
// has the same types and values, and the properties.
func TestHeaderTypesAndPropertiesSurvive(t *testing.T) {
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	in, out := a.queue(unique(t)+"-in"), a.queue(unique(t)+"-out")
	src := newSource(t, node.URL, in, 10)
	sink := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})

	sent := rabbitbroker.EveryFieldType()
	sent["x-delay"] = int32(1500)
	ts := time.Unix(1795000000, 0)
	a.publish(in, amqp.Publishing{
		Headers:         sent,
		ContentType:     "application/json",
		ContentEncoding: "utf-8",
		CorrelationId:   "corr-1",
		ReplyTo:         "replies",
		Expiration:      "600000",
		Priority:        7,
		Type:            "task",
		AppId:           "app",
		UserId:          "guest", // the broker checks it: the publisher's own user
		Timestamp:       ts,
		MessageId:       "m-1",
		Body:            []byte("body"),
	})
	inc, ack := read(t, src)
	if err := ack(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	d := envelope.Parse(inc, &envelope.Route{Sink: "rabbit", Destination: out}, envelope.Limits{}, time.Now(), nil)
	if d.Action != envelope.Park {
		t.Fatalf("parse: %v %v", d.Action, d.Err)
	}
	ring, err := seal.New("k", []seal.Key{{ID: "k", Secret: bytes.Repeat([]byte{9}, seal.KeySize)}})
	if err != nil {
		t.Fatal(err)
	}
	m, blob := park(t, d.Message, ring)
	if bytes.Contains(blob, []byte("corr-1")) || bytes.Contains(blob, []byte("i64max")) {
		t.Fatal("properties or headers in clear in a sealed message")
	}
	noErrors(t, publish(t, sink, []sinks.Outgoing{{Message: m, Attempt: 1}}))
	got := a.get(out)

	for k, v := range sent {
		if k == "x-delay" {
			continue
		}
		if w, ok := got.Headers[k]; !ok || !rabbitbroker.SameField(w, v) {
			t.Errorf("header %s: got %#v (%T), sent %#v (%T)", k, w, w, v, v)
		}
	}
	if _, ok := got.Headers["x-delay"]; ok {
		t.Error("x-delay forwarded")
	}
	for k, want := range map[string]string{"x-message-id": "m-1", "x-delaybridge-attempt": "1"} {
		if v, ok := got.Headers[k].(string); !ok || v != want {
			t.Errorf("%s = %#v, want the string %q", k, got.Headers[k], want)
		}
	}
	if _, ok := got.Headers["x-delaybridge-due-at"].(string); !ok {
		t.Errorf("x-delaybridge-due-at = %#v, want a string", got.Headers["x-delaybridge-due-at"])
	}
	gotProps := []any{got.ContentType, got.ContentEncoding, got.CorrelationId, got.ReplyTo, got.Expiration,
		got.Priority, got.Type, got.AppId, got.UserId, got.Timestamp.Unix(), got.MessageId, got.DeliveryMode}
	wantProps := []any{"application/json", "utf-8", "corr-1", "replies", "600000",
		uint8(7), "task", "app", "guest", ts.Unix(), "m-1", amqp.Persistent}
	for i := range wantProps {
		if gotProps[i] != wantProps[i] {
			t.Errorf("properties %v, want %v", gotProps, wantProps)
			break
		}
	}
}

// TestSinkUserIDOnlyForItsOwnUser: RabbitMQ refuses (closing the channel) a
// publish whose user_id is not the connection's user, so a sink logged in
// as another user leaves user_id out, and the message still goes.
func TestSinkUserIDOnlyForItsOwnUser(t *testing.T) {
	node := testenv.RabbitMQ(t)
	node.AddUser(t, "delaybridge-other", "pw")
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	other := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true,
		Auth: rabbitbroker.Auth{Username: "delaybridge-other", Password: "pw"}})
	guest := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	m := msg("uid-1", q)
	m.Properties = envelope.Headers{{Key: rabbitbroker.PropUserID, Value: "guest"}, {Key: rabbitbroker.PropAppID, Value: "app"}}
	noErrors(t, publish(t, other, []sinks.Outgoing{m}))
	if d := a.get(q); d.UserId != "" || d.AppId != "app" {
		t.Errorf("via another user: user_id %q app_id %q, want none and app", d.UserId, d.AppId)
	}
	noErrors(t, publish(t, guest, []sinks.Outgoing{m}))
	if d := a.get(q); d.UserId != "guest" {
		t.Errorf("via guest: user_id %q, want guest", d.UserId)
	}
}

// parkedV1 is a message as delaybridge stored it before headers kept their
// types (envelope encoding version 1, in clear, written by that release's
// envelope.Encode): ID "old-1", due 2026-05-06T07:08:09.123Z, ingested 5 s
// before, sink "rabbit", destination "old-q", ingest "rabbit-in", headers
// x-num "42", x-bool "true", x-table `{"a":1}` (the string forms of the
// time), body "old body".
const parkedV1 = "0102c6c0ecc1bf678f4e0006726162626974056f6c642d71097261626269742d696e03" +
	"05782d6e756d023432" + // x-num: 42
	"06782d626f6f6c0474727565" + // x-bool: true
	"07782d7461626c65077b2261223a317d" + // x-table: {"a":1}
	"6f6c6420626f6479" // old body

// TestSinkPublishesVersion1Messages: messages parked in the old encoding
// still publish after an upgrade, with the string headers they were parked
// with and no properties.
func TestSinkPublishesVersion1Messages(t *testing.T) {
	blob, err := hex.DecodeString(parkedV1)
	if err != nil {
		t.Fatal(err)
	}
	if blob[0] != 1 {
		t.Fatalf("not a version 1 blob: %x", blob[:1])
	}
	m, err := envelope.Decode("old-1", blob)
	if err != nil {
		t.Fatal(err)
	}
	node := testenv.RabbitMQ(t)
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	m.Destination = q
	sink := newSink(t, rabbitbroker.SinkParams{URL: node.URL, Mandatory: true})
	noErrors(t, publish(t, sink, []sinks.Outgoing{{Message: m, Attempt: 1}}))
	d := a.get(q)
	want := amqp.Table{
		"x-num": "42", "x-bool": "true", "x-table": `{"a":1}`,
		"x-message-id": "old-1", "x-delaybridge-due-at": "2026-05-06T07:08:09.123Z", "x-delaybridge-attempt": "1",
	}
	if len(d.Headers) != len(want) {
		t.Errorf("headers %#v, want %#v", d.Headers, want)
	}
	for k, v := range want {
		if d.Headers[k] != v {
			t.Errorf("%s = %#v, want %#v", k, d.Headers[k], v)
		}
	}
	if string(d.Body) != "old body" || d.MessageId != "old-1" || d.ContentType != "" || d.Priority != 0 {
		t.Errorf("body %q message_id %q content_type %q priority %d", d.Body, d.MessageId, d.ContentType, d.Priority)
	}
	if m.Properties != nil {
		t.Errorf("properties %v from a version 1 message", m.Properties)
	}
}
