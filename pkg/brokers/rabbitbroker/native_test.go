package rabbitbroker

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// sameField reports whether a and b are the same AMQP field value: the same
// Go type (hence the same field type on the wire) and value, nested
// included. Floats compare by their bits (NaN equals itself), timestamps
// by instant.
func sameField(a, b any) bool {
	switch a := a.(type) {
	case float32:
		b, ok := b.(float32)
		return ok && math.Float32bits(a) == math.Float32bits(b)
	case float64:
		b, ok := b.(float64)
		return ok && math.Float64bits(a) == math.Float64bits(b)
	case time.Time:
		b, ok := b.(time.Time)
		return ok && a.Equal(b)
	case []byte:
		b, ok := b.([]byte)
		return ok && bytes.Equal(a, b)
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameField(a[i], b[i]) {
				return false
			}
		}
		return true
	case amqp.Table:
		b, ok := b.(amqp.Table)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !sameField(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}

// everyFieldType holds one or more values of every type amqp091-go reads
// from a field table, at the edges of their ranges: a table RabbitMQ
// accepts (it closes the channel of a publish with a NaN or infinite
// float).
func everyFieldType() amqp.Table {
	ts := time.Unix(1795000000, 0)
	return amqp.Table{
		"void":   nil,
		"true":   true,
		"false":  false,
		"i8":     int8(math.MinInt8),
		"i8max":  int8(math.MaxInt8),
		"u8":     uint8(math.MaxUint8),
		"i16":    int16(math.MinInt16),
		"i16max": int16(math.MaxInt16),
		"i32":    int32(math.MinInt32),
		"i32max": int32(math.MaxInt32),
		"i64":    int64(math.MinInt64),
		"i64max": int64(math.MaxInt64),
		"u16":    uint16(math.MaxUint16),
		"u32":    uint32(math.MaxUint32),
		"f32":    float32(-1.25),
		"f64":    math.SmallestNonzeroFloat64,
		"dec":    amqp.Decimal{Scale: 255, Value: math.MinInt32},
		"time":   ts,
		"before": time.Unix(-1, 0),
		"str":    "héllo\x00",
		"empty":  "",
		"bytes":  []byte{0, 1, 0xff},
		"nobyte": []byte{},
		"array":  []any{int32(1), "two", nil, 3.5, []any{nil, false}, amqp.Table{"k": uint16(7)}},
		"none":   []any{},
		"table":  amqp.Table{"a": int8(-1), "": amqp.Table{}, strings.Repeat("k", 255): []byte("v")},
	}
}

func TestNativeRoundTrip(t *testing.T) {
	values := everyFieldType()
	values["f32nan"] = float32(math.NaN())
	values["f64inf"] = math.Inf(-1)
	for k, v := range values {
		enc, err := encodeNative(v)
		if err != nil {
			t.Fatalf("%s: encode %#v: %v", k, v, err)
		}
		got, err := decodeNative(enc)
		if err != nil {
			t.Fatalf("%s: decode %x: %v", k, enc, err)
		}
		if !sameField(got, v) {
			t.Errorf("%s: %#v (%T) came back as %#v (%T)", k, v, v, got, got)
		}
		if again, _ := encodeNative(got); again != enc {
			t.Errorf("%s: encoding not stable: %x then %x", k, enc, again)
		}
	}
	// The whole table as one nested value, too.
	all := everyFieldType()
	enc, err := encodeNative(all)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeNative(enc)
	if err != nil || !sameField(got, all) {
		t.Fatalf("table of every type: %v, %#v", err, got)
	}
}

// The encoding is compact: the common small values take two or three bytes.
func TestNativeSizes(t *testing.T) {
	for v, want := range map[any]int{int32(1500): 3, true: 2, nil: 1, uint8(9): 2, int64(-1): 2} {
		if enc, _ := encodeNative(v); len(enc) != want {
			t.Errorf("%#v: %d bytes (%x), want %d", v, len(enc), enc, want)
		}
	}
}

func TestNativeRefuses(t *testing.T) {
	// Go types amqp091-go never reads from a table.
	for _, v := range []any{int(1), uint64(1), map[string]any{}, []string{"a"}, struct{}{}} {
		if _, err := encodeNative(v); err == nil {
			t.Errorf("%T encoded", v)
		}
	}
	if _, err := encodeNative(amqp.Table{strings.Repeat("k", 256): 1}); err == nil {
		t.Error("a table key over 255 bytes encoded")
	}
	deep := func(n int) any {
		var v any = int32(1)
		for i := 0; i < n; i++ {
			v = []any{v}
		}
		return v
	}
	if _, err := encodeNative(deep(maxNativeDepth)); err != nil {
		t.Errorf("%d nested arrays (what amqp091-go reads): %v", maxNativeDepth, err)
	}
	if _, err := encodeNative(deep(maxNativeDepth + 1)); err == nil {
		t.Errorf("%d nested arrays encoded", maxNativeDepth+1)
	}

	for name, b := range map[string]string{
		"empty":             "",
		"unknown tag":       "L\x01",
		"trailing":          "V\x00",
		"bool 2":            "t\x02",
		"int16 range":       "s\x80\x80\x04", // zig-zag 32768
		"int32 range":       "I\x80\x80\x80\x80\x10",
		"uint16 range":      "u\x80\x80\x04",
		"short float":       "f\x00\x00",
		"short string":      "S\x05ab",
		"huge string":       "S\xff\xff\xff\xff\x0f",
		"huge array":        "A\xff\xff\xff\xff\x0f",
		"count over bytes":  "A\x05VV",
		"over 8192":         "A\x81\x40" + strings.Repeat("V", 8193),
		"long table key":    "F\x01\x80\x02" + strings.Repeat("k", 256) + "V",
		"duplicate key":     "F\x02\x01kV\x01kV",
		"truncated varint":  "l\x80",
		"truncated decimal": "D\x02",
		"too deep":          strings.Repeat("A\x01", maxNativeDepth+1) + "V",
	} {
		if v, err := decodeNative(b); err == nil {
			t.Errorf("%s: decoded %x as %#v", name, b, v)
		}
	}
	if _, err := decodeNative(strings.Repeat("A\x01", maxNativeDepth) + "V"); err != nil {
		t.Errorf("%d nested arrays: %v", maxNativeDepth, err)
	}
}

// FuzzNativeDecode feeds the decoder what Redis could hold: it never
// panics, and what it accepts encodes to a stable form.
func FuzzNativeDecode(f *testing.F) {
	for _, v := range everyFieldType() {
		enc, _ := encodeNative(v)
		f.Add([]byte(enc))
	}
	all, _ := encodeNative(everyFieldType())
	f.Add([]byte(all))
	f.Add([]byte(strings.Repeat("A\x01", 40) + "V"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeNative(string(b))
		if err != nil {
			return
		}
		enc, err := encodeNative(v)
		if err != nil {
			t.Fatalf("decoded %x as %#v, which does not encode: %v", b, v, err)
		}
		w, err := decodeNative(enc)
		if err != nil || !sameField(v, w) {
			t.Fatalf("%x: %#v re-encodes as %x, which decodes as %#v (%v)", b, v, enc, w, err)
		}
		if again, _ := encodeNative(w); again != enc {
			t.Fatalf("%x: unstable encoding %x then %x", b, enc, again)
		}
	})
}
