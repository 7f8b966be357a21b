package envelope

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The stored encoding, version 1. Integers are varints (encoding/binary);
// strings and byte fields are a uvarint length followed by the bytes; the
// body is stored raw, last, with no length, so that a parked body costs its
// own size and nothing more.
//
//	byte    version (1)
//	byte    flags   (bit 0: key present; bit 1: ingested at present;
//	                 bits 2-7 must be zero in version 1)
//	varint  due at, Unix milliseconds
//	varint  ingested at, milliseconds relative to due at (0 when absent)
//	byte    priority
//	string  sink
//	string  destination
//	string  ingest
//	bytes   key          (only when flag bit 0 is set)
//	uvarint header count, then per header: string key, string value
//	...     body (the rest)
//
// A new field or an encrypted variant gets a new version byte or flag bit;
// Decode refuses what it does not know instead of guessing.
const (
	codecV1 byte = 1

	flagKey      byte = 1 << 0
	flagIngested byte = 1 << 1
	knownV1           = flagKey | flagIngested
)

// ErrCorrupt is wrapped by every Decode error.
var ErrCorrupt = errors.New("envelope: corrupt stored message")

// Encode appends the stored form of m (all but its ID) to dst.
func Encode(dst []byte, m *Message) []byte {
	var flags byte
	if m.Key != nil {
		flags |= flagKey
	}
	due := m.DueAt.UnixMilli()
	ingested := int64(0)
	if !m.IngestedAt.IsZero() {
		flags |= flagIngested
		ingested = m.IngestedAt.UnixMilli() - due
	}
	dst = append(dst, codecV1, flags)
	dst = binary.AppendVarint(dst, due)
	dst = binary.AppendVarint(dst, ingested)
	dst = append(dst, m.Priority)
	dst = appendString(dst, m.Sink)
	dst = appendString(dst, m.Destination)
	dst = appendString(dst, m.Ingest)
	if m.Key != nil {
		dst = appendString(dst, string(m.Key))
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.Headers)))
	for _, h := range m.Headers {
		dst = appendString(dst, h.Key)
		dst = appendString(dst, h.Value)
	}
	return append(dst, m.Body...)
}

// EncodedSize is an upper bound of len(Encode(nil, m)), for sizing buffers.
func EncodedSize(m *Message) int {
	n := 2 + 2*binary.MaxVarintLen64 + 1 + 3*binary.MaxVarintLen64 + len(m.Sink) + len(m.Destination) + len(m.Ingest)
	n += binary.MaxVarintLen64 + len(m.Key) + binary.MaxVarintLen64
	for _, h := range m.Headers {
		n += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	return n + len(m.Body)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decode parses a stored message. The returned Body aliases b.
func Decode(id string, b []byte) (*Message, error) {
	d := decoder{b: b}
	if len(b) < 2 {
		return nil, fmt.Errorf("%w %q: %d bytes", ErrCorrupt, id, len(b))
	}
	if b[0] != codecV1 {
		return nil, fmt.Errorf("%w %q: unknown version %d (written by a newer delaybridge?)", ErrCorrupt, id, b[0])
	}
	flags := b[1]
	if flags&^knownV1 != 0 {
		return nil, fmt.Errorf("%w %q: unknown flags %#x (written by a newer delaybridge?)", ErrCorrupt, id, flags)
	}
	d.b = b[2:]
	m := &Message{ID: id}
	due := d.varint()
	ingested := d.varint()
	m.DueAt = time.UnixMilli(due)
	if flags&flagIngested != 0 {
		m.IngestedAt = time.UnixMilli(due + ingested)
	}
	m.Priority = d.byte()
	m.Sink = d.string()
	m.Destination = d.string()
	m.Ingest = d.string()
	if flags&flagKey != 0 {
		m.Key = []byte(d.string())
	}
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) { // every header takes at least 2 bytes
		d.err = fmt.Errorf("header count %d exceeds remaining %d bytes", n, len(d.b))
	}
	if d.err == nil && n > 0 {
		m.Headers = make(Headers, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			k := d.string()
			v := d.string()
			m.Headers = append(m.Headers, Header{k, v})
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrCorrupt, id, d.err)
	}
	m.Body = d.b
	return m, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errors.New("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errors.New("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("length %d exceeds remaining %d bytes", n, len(d.b))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
