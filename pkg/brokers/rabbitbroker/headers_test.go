package rabbitbroker

import (
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

func TestHeadersConversion(t *testing.T) {
	ts := time.Date(2026, 12, 1, 10, 0, 0, 0, time.FixedZone("x", 3600))
	in := amqp.Table{
		"x-delay":   int32(5000),
		"i8":        int8(-8),
		"i16":       int16(-16),
		"i64":       int64(1) << 40,
		"u8":        uint8(8),
		"u16":       uint16(16),
		"u32":       uint32(32),
		"f32":       float32(1.5),
		"f64":       float64(1500000),
		"nan":       math.NaN(),
		"dec":       amqp.Decimal{Scale: 2, Value: -12345},
		"bool":      true,
		"bytes":     []byte("raw\x00bytes"),
		"str":       "hello",
		"time":      ts,
		"void":      nil,
		"table":     amqp.Table{"b": int32(2), "a": []byte("x"), "t": ts, "n": math.Inf(1)},
		"array":     []any{"s", int64(7), 2.5, amqp.Decimal{Scale: 1, Value: 15}, nil},
		"X-Cased":   "kept",
		"x-deliver": "2026-12-01T10:00:00Z",
	}
	got := Headers(in)
	want := envelope.Headers{
		{Key: "X-Cased", Value: "kept"},
		{Key: "array", Value: `["s",7,2.5,1.5,null]`},
		{Key: "bool", Value: "true"},
		{Key: "bytes", Value: "raw\x00bytes"},
		{Key: "dec", Value: "-123.45"},
		{Key: "f32", Value: "1.5"},
		{Key: "f64", Value: "1500000"},
		{Key: "i16", Value: "-16"},
		{Key: "i64", Value: "1099511627776"},
		{Key: "i8", Value: "-8"},
		{Key: "nan", Value: "NaN"},
		{Key: "str", Value: "hello"},
		{Key: "table", Value: `{"a":"x","b":2,"n":"+Inf","t":"2026-12-01T09:00:00Z"}`},
		{Key: "time", Value: "2026-12-01T09:00:00Z"},
		{Key: "u16", Value: "16"},
		{Key: "u32", Value: "32"},
		{Key: "u8", Value: "8"},
		{Key: "void", Value: ""},
		{Key: "x-delay", Value: "5000"},
		{Key: "x-deliver", Value: "2026-12-01T10:00:00Z"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d headers, want %d: %q", len(got), len(want), got)
	}
	// The string forms are what Kafka and NATS sinks publish: unchanged
	// since before headers kept their types.
	for i := range want {
		if got[i].Key != want[i].Key || got[i].Value != want[i].Value {
			t.Errorf("header %d: got %q=%q, want %q=%q", i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
		}
	}
	// The native values are what a RabbitMQ sink publishes: the type and
	// value received; a string needs none.
	for _, h := range got {
		_, isString := in[h.Key].(string)
		if isString != (h.Native == "") {
			t.Errorf("%s: native %q for a %T", h.Key, h.Native, in[h.Key])
		}
		if v := tableValue(h); !sameField(v, in[h.Key]) {
			t.Errorf("%s: publishes %#v (%T), want %#v (%T)", h.Key, v, v, in[h.Key], in[h.Key])
		}
	}
	if d, reason := envelope.ParseDelay(mustGet(t, got, "X-DELAY")); reason != "" || d != 5*time.Second {
		t.Errorf("integer x-delay parses as %v (%s), want 5s", d, reason)
	}
	if Headers(nil) != nil {
		t.Error("empty table: want nil headers")
	}
}

func mustGet(t *testing.T, h envelope.Headers, key string) string {
	t.Helper()
	v, ok := h.Get(key)
	if !ok {
		t.Fatalf("no header %q in %q", key, h)
	}
	return v
}
