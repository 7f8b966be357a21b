package rabbitbroker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The native encoding keeps one AMQP field value with its type through the
// store (envelope.Header.Native), so that a RabbitMQ sink publishes it back
// as the RabbitMQ ingest received it. It is a tag byte, the AMQP field-value
// letter (as amqp091-go reads and writes it), then the value:
//
//	t          1 byte: 0 false, 1 true
//	b, B       1 byte (int8, uint8)
//	s, I, l    varint (int16, int32, int64; zig-zag, encoding/binary)
//	u, i       uvarint (uint16, uint32)
//	f, d       4 or 8 bytes, the IEEE 754 bits, big-endian (NaN payloads kept)
//	D          1 byte scale, varint value (amqp.Decimal)
//	T          varint Unix seconds (AMQP timestamps have whole seconds)
//	S, x       uvarint length, bytes (string, []byte)
//	A          uvarint count, then count values
//	F          uvarint count, then per entry: uvarint key length (at most
//	           255, an AMQP short string), key, value; keys sorted, unique
//	V          nothing (void, nil)
//
// Integers of each width decode only within their range, so a value comes
// back as the Go type amqp091-go reads for its letter and goes out with the
// same letter. The decoder reads bytes from Redis, so it trusts nothing: it
// never panics, bounds nesting at maxNativeDepth containers and each
// container at maxNativeElements entries (amqp091-go's own read limits: what
// it read, this encodes), checks every count and length against the bytes
// left, and refuses trailing bytes.
const (
	maxNativeDepth    = 32
	maxNativeElements = 8192
	maxShortString    = 255
)

// errNativeType is returned for a Go value that is not one amqp091-go reads
// from a field table.
var errNativeType = errors.New("not an AMQP field value type")

// encodeNative returns the native encoding of v, a value as amqp091-go reads
// it from a field table.
func encodeNative(v any) (string, error) {
	b, err := appendNative(nil, v, 0)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func appendNative(dst []byte, v any, depth int) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, 'V'), nil
	case bool:
		if v {
			return append(dst, 't', 1), nil
		}
		return append(dst, 't', 0), nil
	case int8:
		return append(dst, 'b', byte(v)), nil
	case uint8:
		return append(dst, 'B', v), nil
	case int16:
		return binary.AppendVarint(append(dst, 's'), int64(v)), nil
	case int32:
		return binary.AppendVarint(append(dst, 'I'), int64(v)), nil
	case int64:
		return binary.AppendVarint(append(dst, 'l'), v), nil
	case uint16:
		return binary.AppendUvarint(append(dst, 'u'), uint64(v)), nil
	case uint32:
		return binary.AppendUvarint(append(dst, 'i'), uint64(v)), nil
	case float32:
		return binary.BigEndian.AppendUint32(append(dst, 'f'), math.Float32bits(v)), nil
	case float64:
		return binary.BigEndian.AppendUint64(append(dst, 'd'), math.Float64bits(v)), nil
	case amqp.Decimal:
		return binary.AppendVarint(append(dst, 'D', v.Scale), int64(v.Value)), nil
	case time.Time:
		return binary.AppendVarint(append(dst, 'T'), v.Unix()), nil
	case string:
		return appendBytes(append(dst, 'S'), v), nil
	case []byte:
		return appendBytes(append(dst, 'x'), string(v)), nil
	case []any:
		if depth >= maxNativeDepth {
			return nil, fmt.Errorf("nested deeper than %d arrays and tables", maxNativeDepth)
		}
		if len(v) > maxNativeElements {
			return nil, fmt.Errorf("array of %d values, over %d", len(v), maxNativeElements)
		}
		dst = binary.AppendUvarint(append(dst, 'A'), uint64(len(v)))
		var err error
		for _, x := range v {
			if dst, err = appendNative(dst, x, depth+1); err != nil {
				return nil, err
			}
		}
		return dst, nil
	case amqp.Table:
		if depth >= maxNativeDepth {
			return nil, fmt.Errorf("nested deeper than %d arrays and tables", maxNativeDepth)
		}
		if len(v) > maxNativeElements {
			return nil, fmt.Errorf("table of %d entries, over %d", len(v), maxNativeElements)
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			if len(k) > maxShortString {
				return nil, fmt.Errorf("table key %.40q... is longer than %d bytes", k, maxShortString)
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = binary.AppendUvarint(append(dst, 'F'), uint64(len(v)))
		var err error
		for _, k := range keys {
			dst = appendBytes(dst, k)
			if dst, err = appendNative(dst, v[k], depth+1); err != nil {
				return nil, err
			}
		}
		return dst, nil
	}
	return nil, fmt.Errorf("%w: %T", errNativeType, v)
}

func appendBytes(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

// decodeNative parses a native encoding into the Go value amqp091-go
// publishes with the same field type.
func decodeNative(s string) (any, error) {
	d := nativeDecoder{b: []byte(s)}
	v := d.value(0)
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d bytes after the value", len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("native AMQP value: %w", d.err)
	}
	return v, nil
}

type nativeDecoder struct {
	b   []byte
	err error
}

func (d *nativeDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *nativeDecoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail("truncated: %d bytes wanted, %d left", n, len(d.b))
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *nativeDecoder) byte() byte {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *nativeDecoder) varint(lo, hi int64) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	if v < lo || v > hi {
		d.fail("integer %d out of range [%d, %d]", v, lo, hi)
		return 0
	}
	return v
}

func (d *nativeDecoder) uvarint(hi uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	if v > hi {
		d.fail("integer %d over %d", v, hi)
		return 0
	}
	return v
}

// bytes reads a uvarint length and that many bytes.
func (d *nativeDecoder) bytes(maxLen uint64) []byte {
	n := d.uvarint(maxLen)
	if d.err == nil && n > uint64(len(d.b)) {
		d.fail("length %d exceeds the %d bytes left", n, len(d.b))
	}
	return d.take(int(n))
}

// count reads a container's element count: at most maxNativeElements, and
// at most the bytes left divided by the least bytes one element takes.
func (d *nativeDecoder) count(minSize int) int {
	n := d.uvarint(maxNativeElements)
	if d.err == nil && n > uint64(len(d.b)/minSize) {
		d.fail("%d elements cannot fit in the %d bytes left", n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *nativeDecoder) value(depth int) any {
	tag := d.byte()
	if d.err != nil {
		return nil
	}
	switch tag {
	case 'V':
		return nil
	case 't':
		switch d.byte() {
		case 0:
			return false
		case 1:
			return true
		}
		d.fail("boolean that is neither 0 nor 1")
		return nil
	case 'b':
		return int8(d.byte())
	case 'B':
		return d.byte()
	case 's':
		return int16(d.varint(math.MinInt16, math.MaxInt16))
	case 'I':
		return int32(d.varint(math.MinInt32, math.MaxInt32))
	case 'l':
		return d.varint(math.MinInt64, math.MaxInt64)
	case 'u':
		return uint16(d.uvarint(math.MaxUint16))
	case 'i':
		return uint32(d.uvarint(math.MaxUint32))
	case 'f':
		if p := d.take(4); p != nil {
			return math.Float32frombits(binary.BigEndian.Uint32(p))
		}
		return nil
	case 'd':
		if p := d.take(8); p != nil {
			return math.Float64frombits(binary.BigEndian.Uint64(p))
		}
		return nil
	case 'D':
		scale := d.byte()
		return amqp.Decimal{Scale: scale, Value: int32(d.varint(math.MinInt32, math.MaxInt32))}
	case 'T':
		return time.Unix(d.varint(math.MinInt64, math.MaxInt64), 0)
	case 'S':
		return string(d.bytes(math.MaxInt32))
	case 'x':
		return append([]byte{}, d.bytes(math.MaxInt32)...)
	case 'A':
		if depth >= maxNativeDepth {
			d.fail("nested deeper than %d arrays and tables", maxNativeDepth)
			return nil
		}
		n := d.count(1) // the smallest value, void, is one byte
		a := make([]any, 0, n)
		for i := 0; i < n && d.err == nil; i++ {
			a = append(a, d.value(depth+1))
		}
		return a
	case 'F':
		if depth >= maxNativeDepth {
			d.fail("nested deeper than %d arrays and tables", maxNativeDepth)
			return nil
		}
		n := d.count(2) // an empty key and a void
		t := make(amqp.Table, n)
		for i := 0; i < n && d.err == nil; i++ {
			k := string(d.bytes(maxShortString))
			if _, dup := t[k]; dup && d.err == nil {
				d.fail("table key %q twice", k)
			}
			t[k] = d.value(depth + 1)
		}
		return t
	}
	d.fail("unknown field type %q", tag)
	return nil
}
