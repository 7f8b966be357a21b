package rabbitbroker

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Headers converts an AMQP headers table to envelope headers, sorted by key
// so that the result is deterministic. A value that is not a string keeps
// its type in Native (see native.go), which a RabbitMQ sink publishes back;
// Value is the string form every other sink publishes:
//
//   - strings and byte arrays as they are;
//   - integers in decimal (RabbitMQ's delayed-exchange publishers send
//     x-delay as an integer, which then parses as milliseconds);
//   - floats in the shortest decimal form without an exponent, decimals
//     as their decimal value ("123.45");
//   - booleans as "true" or "false";
//   - timestamps as RFC 3339 in UTC (AMQP timestamps have whole seconds);
//   - nested tables and arrays as JSON (table keys sorted);
//   - void (no value) as "".
func Headers(t amqp.Table) envelope.Headers {
	if len(t) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(t))
	out := make(envelope.Headers, 0, len(keys))
	for _, k := range keys {
		out = append(out, header(k, t[k]))
	}
	return out
}

// header converts one AMQP header. A string needs no Native; a value of a
// type amqp091-go does not read (it never hands one out) keeps only its
// string form.
func header(k string, v any) envelope.Header {
	h := envelope.Header{Key: k, Value: headerString(v)}
	if _, ok := v.(string); !ok {
		h.Native, _ = encodeNative(v)
	}
	return h
}

// tableValue is the value a RabbitMQ sink publishes for h: its native value
// when it has one that decodes, else its string form.
func tableValue(h envelope.Header) any {
	if h.Native != "" {
		if v, err := decodeNative(h.Native); err == nil {
			return v
		}
	}
	return h.Value
}

func headerString(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return string(v)
	case amqp.Table, []any:
		b, err := json.Marshal(jsonValue(v))
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
	if s, ok := scalarString(v); ok {
		return s
	}
	return fmt.Sprint(v)
}

// scalarString formats the numeric, boolean and time field types.
func scalarString(v any) (string, bool) {
	switch v := v.(type) {
	case bool:
		return strconv.FormatBool(v), true
	case int8:
		return strconv.FormatInt(int64(v), 10), true
	case int16:
		return strconv.FormatInt(int64(v), 10), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case int:
		return strconv.FormatInt(int64(v), 10), true
	case uint8:
		return strconv.FormatUint(uint64(v), 10), true
	case uint16:
		return strconv.FormatUint(uint64(v), 10), true
	case uint32:
		return strconv.FormatUint(uint64(v), 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	case float32:
		return strconv.FormatFloat(float64(v), 'f', -1, 32), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case amqp.Decimal:
		return decimalString(v), true
	case time.Time:
		return v.UTC().Format(time.RFC3339), true
	}
	return "", false
}

// decimalString formats an AMQP decimal: Value / 10^Scale.
func decimalString(d amqp.Decimal) string {
	r := new(big.Rat).SetFrac(big.NewInt(int64(d.Value)), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale)), nil))
	return r.FloatString(int(d.Scale))
}

// jsonValue turns a nested AMQP value into one that encoding/json renders
// as the header's readers expect: byte arrays as strings (not base64),
// numbers as numbers, decimals and timestamps as their string forms.
func jsonValue(v any) any {
	switch v := v.(type) {
	case nil, string, bool:
		return v
	case []byte:
		return string(v)
	case amqp.Table:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = jsonValue(x)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, x := range v {
			a[i] = jsonValue(x)
		}
		return a
	case amqp.Decimal:
		return json.Number(decimalString(v))
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	case float32, float64:
		s, _ := scalarString(v)
		if f, err := strconv.ParseFloat(s, 64); err == nil && !isFinite(f) {
			return s // NaN and infinities have no JSON form
		}
		return json.Number(s)
	}
	if s, ok := scalarString(v); ok {
		return json.Number(s)
	}
	return fmt.Sprint(v)
}

func isFinite(f float64) bool { return f-f == 0 }
