package envelope

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"
)

// The stored encoding. Integers are varints (encoding/binary); strings and
// byte fields are a uvarint length followed by the bytes; the body is stored
// raw, last, with no length, so that a parked body costs its own size and
// nothing more. Version 1:
//
//	byte    version (1)
//	byte    flags   (bit 0: key present; bit 1: ingested at present;
//	                 bit 2: sealed; bits 3-7 must be zero)
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
// Version 2 is version 1 with a second flags byte after the first and the
// fields it announces; a message that needs none of them is written in
// version 1, which every delaybridge reads:
//
//	byte    version (2)
//	byte    flags   (as in version 1)
//	byte    ext     (bit 0: published at; bit 1: group; bit 2: recurrence;
//	                 bit 3: headers carry native values; bit 4: properties;
//	                 bits 5-7 must be zero)
//	varint  due at
//	varint  ingested at (relative to due at)
//	varint  published at, relative to due at   (ext bit 0)
//	byte    priority
//	string  sink, destination, ingest
//	string  group                              (ext bit 1)
//	...     recurrence                         (ext bit 2, see appendRecur)
//	bytes   key                                (flag bit 0)
//	uvarint header count, then per header: string key, string value,
//	        and with ext bit 3 string native ("" for none)
//	uvarint property count, then per property: string key, string value,
//	        string native                      (ext bit 4)
//	...     body
//
// Version 3 is version 2 with the fields of "Identity and order" (and, as
// before, written only when a message needs one of them, so that a version
// that reads 2 reads every message that does not):
//
//	byte    version (3)
//	byte    flags   (as in version 1, and bit 3: the body is a Kafka null
//	                 value, not an empty one; bit 4: source; bit 5: the
//	                 recurrence ends with missed_max; bits 6-7 must be zero)
//	byte    ext     (as in version 2, and bit 5: origin; bit 6: headers
//	                 carry null marks; bit 7: print)
//	varint  due at, ingested at
//	varint  published at, relative to due at   (ext bit 0), then
//	uvarint its nanoseconds within that millisecond
//	byte    priority
//	string  sink, destination, ingest
//	string  source (the message's own name in its broker; flag bit 4)
//	string  origin log, uvarint origin position (ext bit 5)
//	8 bytes origin print, big endian           (ext bit 7)
//	string  group (ext bit 1); recurrence (ext bit 2), then uvarint
//	        missed_max (flag bit 5)
//	bytes   key                                (flag bit 0)
//	uvarint header count, then per header: string key, string value,
//	        string native (ext bit 3), byte 1 for a null value (ext bit 6)
//	...     properties                         (ext bit 4)
//	...     body
//
// A sealed message (flag bit 2, written by Codec with a Sealer) keeps the
// routing fields in clear, up to and including the recurrence, and replaces
// the rest (key, headers, properties, body: the private part) with
//
//	string  key ID       (the Sealer key that sealed it)
//	...     sealed       (the rest: Sealer.Seal of the private part, for
//	                      AES-GCM 12 bytes nonce, ciphertext, 16 bytes tag)
//
// A sealed message with a group or a recurrence has flag bit 6 too (version
// 3): its group field holds the group's index
// token (Codec.GroupIndex: a keyed hash, what pkg/store indexes the group
// by), its recurrence (and missed_max) is left out of the clear part, and
// the private part starts with them:
//
//	string  group                              (ext bit 1)
//	...     recurrence, then uvarint missed_max (ext bit 2; flag bit 5)
//	...     key, headers, properties, body as above
//
// Sealed messages without flag bit 6, their group and schedule in clear,
// still open (testdata/sealed-v3.txt); `delaybridge reencrypt` writes them again
// in this form.
//
// The additional authenticated data is uvarint len(ID), the ID, then every
// stored byte before sealed (version through key ID): a sealed blob stored
// under another ID, or with any routing field, flag or key ID changed, does
// not open. The routing fields stay readable so that operators (inspect,
// the dead list) see where a message goes even without its key, and the
// scripts can route, hold and index it: the sink, destination, ingest and
// source names, the origin, the times, the priority, whether it has a
// group and a schedule, whether there is a Kafka key and the size of the
// private part are visible in Redis (docs/security.md lists them).
//
// A new field or another variant gets a new version byte or flag bit;
// Decode refuses what it does not know instead of guessing.
const (
	codecV1 byte = 1
	codecV2 byte = 2
	codecV3 byte = 3

	flagKey      byte = 1 << 0
	flagIngested byte = 1 << 1
	flagSealed   byte = 1 << 2
	flagNullBody byte = 1 << 3 // version 3
	flagSource   byte = 1 << 4 // version 3
	flagMissed   byte = 1 << 5 // version 3
	flagHidden   byte = 1 << 6 // version 3, with flagSealed: the group is its token, the schedule sealed
	knownFlags        = flagKey | flagIngested | flagSealed
	knownFlagsV3      = knownFlags | flagNullBody | flagSource | flagMissed | flagHidden

	extPublished byte = 1 << 0
	extGroup     byte = 1 << 1
	extRecur     byte = 1 << 2
	extNative    byte = 1 << 3
	extProps     byte = 1 << 4
	extOrigin    byte = 1 << 5 // version 3
	extNulls     byte = 1 << 6 // version 3
	extPrint     byte = 1 << 7 // version 3
	knownExt          = extPublished | extGroup | extRecur | extNative | extProps
	extV3             = extOrigin | extNulls | extPrint
)

// StoredLayout is what a reader of the stored encoding outside Go must know
// of it: pkg/store's scripts read the routing part (due time, priority,
// sink, destination, ingest, origin, group) without a round trip, and their
// constants are generated from this, so that each number of the layout is
// written once. Bit numbers count from 0.
var StoredLayout = struct {
	V1, V2, V3                                                        int
	ExtPublished, ExtGroup, ExtRecur, ExtOrigin, ExtPrint, FlagSource int
}{
	int(codecV1), int(codecV2), int(codecV3),
	bits.TrailingZeros8(extPublished), bits.TrailingZeros8(extGroup), bits.TrailingZeros8(extRecur),
	bits.TrailingZeros8(extOrigin), bits.TrailingZeros8(extPrint), bits.TrailingZeros8(flagSource),
}

// ErrCorrupt is wrapped by every Decode error.
var ErrCorrupt = errors.New("envelope: corrupt stored message")

// ErrSealed is wrapped by the Decode error of a sealed message that cannot be
// opened: no Sealer is configured, its key ID is not one the Sealer knows, or
// authentication failed (the blob was altered, stored under another ID, or
// sealed with another key of the same ID). It matches ErrCorrupt as well, so
// every Decode error is still ErrCorrupt.
var ErrSealed error = sealedError{}

type sealedError struct{}

func (sealedError) Error() string        { return "envelope: cannot open sealed message" }
func (sealedError) Is(target error) bool { return target == ErrCorrupt }

// Sealer encrypts and authenticates the private part of a stored message
// (key, headers, body; group and schedule) with an AEAD, and hashes a
// sealed message's group for its index with a key of its own. pkg/seal's
// Keyring implements it with AES-256-GCM and HMAC-SHA-256.
// Implementations must be safe for concurrent use and hold no state that
// changes: rotating keys means a new Sealer.
type Sealer interface {
	// KeyID names the key Seal uses (the active key). It is stored with
	// every sealed message, so an ID must always name the same key.
	KeyID() string
	// Seal appends to dst the sealed form of plaintext under the key KeyID
	// names, with aad authenticated but not stored (for AES-GCM: a random
	// nonce, then ciphertext and tag). It must not fail.
	Seal(dst, plaintext, aad []byte) []byte
	// Open appends to dst the plaintext of sealed, which Seal made under the
	// key keyID names with the same aad. The error says why it cannot
	// (keyID is not configured, authentication failed) and never shows
	// anything of a key.
	Open(dst []byte, keyID string, sealed, aad []byte) ([]byte, error)
	// Hash returns a keyed hash of value (at least 16 bytes) under a key
	// derived from the key keyID names, the same for the same value and
	// key ID every time; false when keyID names no key. Without the key,
	// the hash of a value cannot be computed, so it does not show what it
	// hashes.
	Hash(keyID string, value []byte) ([]byte, bool)
	// KeyIDs returns the ID of every key it opens with.
	KeyIDs() []string
}

// groupIndexMark starts a group's index token: a character that no group
// can hold (CheckID refuses C0 controls), so that a token is never taken
// for a group, nor a group a publisher names for another group's token.
const groupIndexMark = "\x01"

// GroupIndex is what pkg/store indexes a message of group under when c
// encodes it (the group field of the stored form): with a Sealer the
// group's token under the active key ("\x01" and 22 characters of
// base64url, a keyed hash), else the group itself; "" for no group.
func (c Codec) GroupIndex(group string) string {
	if group == "" || c.Sealer == nil {
		return group
	}
	return c.groupToken(c.Sealer.KeyID(), group)
}

// GroupIndexes is every form a message of group may be indexed under: the
// group itself (a message stored in clear, before encryption) and its
// token under each key of the Sealer (one sealed with an older key, not
// yet re-encrypted), for finding a group's messages.
func (c Codec) GroupIndexes(group string) []string {
	forms := []string{group}
	if c.Sealer != nil && group != "" {
		for _, id := range c.Sealer.KeyIDs() {
			if t := c.groupToken(id, group); t != "" {
				forms = append(forms, t)
			}
		}
	}
	return forms
}

func (c Codec) groupToken(keyID, group string) string {
	h, ok := c.Sealer.Hash(keyID, []byte(group))
	if !ok || len(h) < groupTokenBytes {
		return ""
	}
	return groupIndexMark + base64.RawURLEncoding.EncodeToString(h[:groupTokenBytes])
}

// groupTokenBytes is how much of the hash a token keeps: 128 bits, so
// that two groups of one store never share a token.
const groupTokenBytes = 16

// Codec encodes and decodes stored messages. With a Sealer it seals what it
// encodes and opens sealed messages; messages stored in clear (before
// encryption was turned on) still decode. The zero Codec is Encode and
// Decode: in clear, and a sealed message does not decode (ErrSealed).
type Codec struct {
	Sealer Sealer
	// RequireSealed refuses messages stored in clear (with ErrSealed): once
	// everything is sealed, nobody with write access to Redis can slip in a
	// message in clear, or clear the sealed flag of a stored one.
	RequireSealed bool
}

// Encode appends the stored form of m (all but its ID) to dst.
func Encode(dst []byte, m *Message) []byte { return Codec{}.Encode(dst, m) }

// Decode parses a stored message. The returned Body aliases b. A sealed
// message fails with ErrSealed: use a Codec with a Sealer.
func Decode(id string, b []byte) (*Message, error) { return Codec{}.Decode(id, b) }

// Encode appends the stored form of m to dst, sealed when c has a Sealer;
// m.ID is authenticated with it.
func (c Codec) Encode(dst []byte, m *Message) []byte {
	var flags byte
	if m.Key != nil {
		flags |= flagKey
	}
	if !m.IngestedAt.IsZero() {
		flags |= flagIngested
	}
	if m.NullBody {
		flags |= flagNullBody
	}
	if m.Source != "" {
		flags |= flagSource
	}
	if r := m.Recur; r != nil && r.MissedMax > 0 && r.MissedMax != DefaultMissedMax {
		flags |= flagMissed
	}
	ext := extFlags(m)
	if c.Sealer == nil {
		dst = appendRouting(dst, m, flags, ext, m.Group)
		return appendPrivate(dst, m, flags, ext)
	}
	flags |= flagSealed
	if m.Group != "" || m.Recur != nil {
		flags |= flagHidden
	}
	// aad = uvarint len(ID), ID, then the stored bytes before the sealed part.
	aad := make([]byte, 0, binary.MaxVarintLen64+len(m.ID)+routingSize(m)+binary.MaxVarintLen64+len(c.Sealer.KeyID()))
	aad = appendString(aad, m.ID)
	idLen := len(aad)
	aad = appendRouting(aad, m, flags, ext, c.GroupIndex(m.Group))
	aad = appendString(aad, c.Sealer.KeyID())
	private := appendPrivate(make([]byte, 0, privateSize(m)), m, flags, ext)
	dst = slices.Grow(dst, len(aad)-idLen+len(private)+sealSlack)
	dst = append(dst, aad[idLen:]...)
	return c.Sealer.Seal(dst, private, aad)
}

// sealSlack is room reserved for a Sealer's nonce and tag (28 bytes for
// AES-GCM), so that Seal does not grow the buffer.
const sealSlack = 64

// extFlags returns the version 2 fields m needs; 0 means version 1.
func extFlags(m *Message) byte {
	var ext byte
	if !m.PublishedAt.IsZero() {
		ext |= extPublished
	}
	if m.Group != "" {
		ext |= extGroup
	}
	if m.Recur != nil {
		ext |= extRecur
	}
	for _, h := range m.Headers {
		if h.Native != "" {
			ext |= extNative
			break
		}
	}
	if len(m.Properties) > 0 {
		ext |= extProps
	}
	if m.Origin.Log != "" {
		ext |= extOrigin
	}
	for _, h := range m.Headers {
		if h.Null {
			ext |= extNulls
			break
		}
	}
	if m.Origin.Print != 0 {
		ext |= extPrint
	}
	return ext
}

// version returns the oldest encoding version that holds what flags and
// ext announce and m's published time.
func version(m *Message, flags, ext byte) byte {
	switch {
	case flags&(flagNullBody|flagSource|flagMissed|flagHidden) != 0 || ext&extV3 != 0 || subMilli(m.PublishedAt) != 0:
		return codecV3
	case ext != 0:
		return codecV2
	}
	return codecV1
}

// subMilli is t's nanoseconds within its millisecond.
func subMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano() - t.UnixMilli()*int64(time.Millisecond)
}

// appendRouting appends the fields that stay in clear: version through the
// recurrence, with group as the group field; with flagHidden, the
// recurrence is left to appendPrivate.
func appendRouting(dst []byte, m *Message, flags, ext byte, group string) []byte {
	due := m.DueAt.UnixMilli()
	ingested := int64(0)
	if !m.IngestedAt.IsZero() {
		ingested = m.IngestedAt.UnixMilli() - due
	}
	v := version(m, flags, ext)
	if v == codecV1 {
		dst = append(dst, codecV1, flags)
	} else {
		dst = append(dst, v, flags, ext)
	}
	dst = binary.AppendVarint(dst, due)
	dst = binary.AppendVarint(dst, ingested)
	if ext&extPublished != 0 {
		dst = binary.AppendVarint(dst, m.PublishedAt.UnixMilli()-due)
		if v == codecV3 {
			dst = binary.AppendUvarint(dst, uint64(subMilli(m.PublishedAt)))
		}
	}
	dst = append(dst, m.Priority)
	dst = appendString(dst, m.Sink)
	dst = appendString(dst, m.Destination)
	dst = appendString(dst, m.Ingest)
	if flags&flagSource != 0 {
		dst = appendString(dst, m.Source)
	}
	if ext&extOrigin != 0 {
		dst = appendString(dst, m.Origin.Log)
		dst = binary.AppendUvarint(dst, m.Origin.Pos)
	}
	if ext&extPrint != 0 {
		dst = binary.BigEndian.AppendUint64(dst, m.Origin.Print)
	}
	if ext&extGroup != 0 {
		dst = appendString(dst, group)
	}
	if flags&flagHidden == 0 {
		dst = appendSchedule(dst, m, flags, ext)
	}
	return dst
}

// appendSchedule appends the recurrence and its missed_max, when m has
// them.
func appendSchedule(dst []byte, m *Message, flags, ext byte) []byte {
	if ext&extRecur != 0 {
		dst = appendRecur(dst, m.Recur)
		if flags&flagMissed != 0 {
			dst = binary.AppendUvarint(dst, uint64(m.Recur.MissedMax))
		}
	}
	return dst
}

// appendRecur appends a recurrence:
//
//	varint  every, milliseconds (0 for a cron schedule)
//	string  cron ("" for an every schedule)
//	string  time zone
//	varint  anchor, Unix milliseconds
//	varint  until, Unix milliseconds (0: no end)
//	uvarint count (0: no limit)
//	uvarint n, the occurrence
//	byte    missed policy
func appendRecur(dst []byte, r *Recurrence) []byte {
	dst = binary.AppendVarint(dst, r.Every.Milliseconds())
	dst = appendString(dst, r.Cron)
	dst = appendString(dst, r.TimeZone)
	dst = binary.AppendVarint(dst, r.Anchor.UnixMilli())
	until := int64(0)
	if !r.Until.IsZero() {
		until = r.Until.UnixMilli()
	}
	dst = binary.AppendVarint(dst, until)
	dst = binary.AppendUvarint(dst, uint64(max(r.Count, 0)))
	dst = binary.AppendUvarint(dst, uint64(max(r.N, 0)))
	return append(dst, byte(r.Missed))
}

// appendPrivate appends the fields a Sealer seals: with flagHidden the
// group and the recurrence, then key, headers, properties, body.
func appendPrivate(dst []byte, m *Message, flags, ext byte) []byte {
	if flags&flagHidden != 0 {
		if ext&extGroup != 0 {
			dst = appendString(dst, m.Group)
		}
		dst = appendSchedule(dst, m, flags, ext)
	}
	if m.Key != nil {
		dst = appendString(dst, string(m.Key))
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.Headers)))
	for _, h := range m.Headers {
		dst = appendString(dst, h.Key)
		dst = appendString(dst, h.Value)
		if ext&extNative != 0 {
			dst = appendString(dst, h.Native)
		}
		if ext&extNulls != 0 {
			dst = append(dst, boolByte(h.Null))
		}
	}
	if ext&extProps != 0 {
		dst = binary.AppendUvarint(dst, uint64(len(m.Properties)))
		for _, h := range m.Properties {
			dst = appendString(dst, h.Key)
			dst = appendString(dst, h.Value)
			dst = appendString(dst, h.Native)
		}
	}
	return append(dst, m.Body...)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func routingSize(m *Message) int {
	n := 3 + 4*binary.MaxVarintLen64 + 1 + 3*binary.MaxVarintLen64 + len(m.Sink) + len(m.Destination) + len(m.Ingest) +
		2*binary.MaxVarintLen64 + len(m.Origin.Log) + 8 + binary.MaxVarintLen64 + len(m.Source)
	if m.Group != "" {
		n += binary.MaxVarintLen64 + max(len(m.Group), len(groupIndexMark)+groupTokenChars)
	}
	return n + scheduleSize(m)
}

// groupTokenChars is the length of a token's base64url part.
var groupTokenChars = base64.RawURLEncoding.EncodedLen(groupTokenBytes)

func scheduleSize(m *Message) int {
	if r := m.Recur; r != nil {
		return 9*binary.MaxVarintLen64 + 1 + len(r.Cron) + len(r.TimeZone)
	}
	return 0
}

// privateSize bounds the private part, the group and the schedule included
// (sealed, they are part of it).
func privateSize(m *Message) int {
	n := binary.MaxVarintLen64 + len(m.Group) + scheduleSize(m) + binary.MaxVarintLen64 + len(m.Key) + binary.MaxVarintLen64
	for _, h := range m.Headers {
		n += 3*binary.MaxVarintLen64 + 1 + len(h.Key) + len(h.Value) + len(h.Native)
	}
	if len(m.Properties) > 0 {
		n += binary.MaxVarintLen64
		for _, h := range m.Properties {
			n += 3*binary.MaxVarintLen64 + len(h.Key) + len(h.Value) + len(h.Native)
		}
	}
	return n + len(m.Body)
}

// EncodedSize is an upper bound of len(Encode(nil, m)), for sizing buffers.
// A sealed encoding adds the key ID and the Sealer's overhead.
func EncodedSize(m *Message) int { return routingSize(m) + privateSize(m) }

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decode parses a stored message, opening it with c's Sealer when it is
// sealed. The returned Body aliases b when the message is in clear (a sealed
// one's is a fresh buffer).
func (c Codec) Decode(id string, b []byte) (*Message, error) { return c.decode(id, b, "") }

// DecodeString is Decode of a stored message read as a string (as a Redis
// reply is): the message's strings (sink, destination, headers...) are
// parts of blob, not copies, and its Body a copy of its part of blob. Two
// allocations per header and three per message fewer than Decode([]byte(blob)).
func (c Codec) DecodeString(id, blob string) (*Message, error) {
	return c.decode(id, []byte(blob), blob)
}

// decode is Decode; src, when not empty, is b as a string, which the
// decoder's strings are taken from.
func (c Codec) decode(id string, b []byte, src string) (*Message, error) {
	m, flags, ext, d, err := decodeRoutingFrom(id, b, src)
	if err != nil {
		return nil, err
	}
	if flags&flagHidden != 0 && flags&flagSealed == 0 {
		return nil, fmt.Errorf("%w %q: a sealed group and schedule in a message stored in clear", ErrCorrupt, id)
	}
	if flags&flagSealed == 0 && c.RequireSealed {
		return nil, fmt.Errorf("%w %q: stored in clear, but encryption.require_sealed is on (`delaybridge reencrypt` seals what is in clear)", ErrSealed, id)
	}
	if flags&flagSealed != 0 {
		keyID := d.string()
		if d.err != nil {
			return nil, fmt.Errorf("%w %q: key ID: %v", ErrCorrupt, id, d.err)
		}
		if c.Sealer == nil {
			return nil, fmt.Errorf("%w %q: sealed with key %q, but encryption is not configured", ErrSealed, id, keyID)
		}
		routing := b[:len(b)-len(d.b)]
		aad := appendString(make([]byte, 0, binary.MaxVarintLen64+len(id)+len(routing)), id)
		aad = append(aad, routing...)
		plain, err := c.Sealer.Open(nil, keyID, d.b, aad)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %w", ErrSealed, id, err)
		}
		d.b, d.src = plain, ""
	}
	if flags&flagHidden != 0 {
		if ext&extGroup != 0 {
			m.Group = d.string()
		}
		d.schedule(m, flags, ext)
	}
	if flags&flagKey != 0 {
		m.Key = []byte(d.string())
	}
	m.NullBody = flags&flagNullBody != 0
	m.Headers = d.headers(ext&extNative != 0, ext&extNulls != 0)
	if ext&extProps != 0 {
		m.Properties = d.headers(true, false)
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrCorrupt, id, d.err)
	}
	m.Body = d.b
	return m, nil
}

// DecodeClear returns the part of a stored message that is kept in clear
// (its due time, route, ingest, priority and origin; no body, headers or
// key): what can be shown of a message whose sealed part cannot be opened
// (a key not configured, the wrong bytes under its ID). The error wraps
// ErrCorrupt.
func DecodeClear(id string, b []byte) (*Message, error) {
	m, _, _, _, err := decodeRouting(id, b)
	return m, err
}

// SealedKeyID reports whether a stored message is sealed and with which key
// ID, reading only the part in clear (nothing is opened or authenticated).
// The error wraps ErrCorrupt.
func SealedKeyID(b []byte) (keyID string, sealed bool, err error) {
	_, flags, _, d, err := decodeRouting("", b)
	if err != nil || flags&flagSealed == 0 {
		return "", false, err
	}
	keyID = d.string()
	if d.err != nil {
		return "", false, fmt.Errorf("%w: key ID: %v", ErrCorrupt, d.err)
	}
	return keyID, true, nil
}

// decodeRouting parses the part every encoding has in clear: version
// through the recurrence. d is left at what follows.
func decodeRouting(id string, b []byte) (*Message, byte, byte, *decoder, error) {
	return decodeRoutingFrom(id, b, "")
}

// decodeRoutingFrom is decodeRouting with src, b as a string or "" (see
// decoder).
func decodeRoutingFrom(id string, b []byte, src string) (*Message, byte, byte, *decoder, error) {
	if len(b) < 2 {
		return nil, 0, 0, nil, fmt.Errorf("%w %q: %d bytes", ErrCorrupt, id, len(b))
	}
	var flags, ext byte
	var d *decoder
	ver := b[0]
	flagsKnown, extKnown := knownFlags, knownExt
	switch ver {
	case codecV1:
		flags, d = b[1], &decoder{b: b[2:], src: src}
	case codecV2, codecV3:
		if len(b) < 3 {
			return nil, 0, 0, nil, fmt.Errorf("%w %q: %d bytes", ErrCorrupt, id, len(b))
		}
		flags, ext, d = b[1], b[2], &decoder{b: b[3:], src: src}
		if ver == codecV3 {
			flagsKnown, extKnown = knownFlagsV3, knownExt|extV3
		} else if ext == 0 {
			return nil, 0, 0, nil, fmt.Errorf("%w %q: version 2 without its flags", ErrCorrupt, id)
		}
		if ext&^extKnown != 0 {
			return nil, 0, 0, nil, fmt.Errorf("%w %q: unknown version %d flags %#x (written by a newer delaybridge?)", ErrCorrupt, id, ver, ext)
		}
	default:
		return nil, 0, 0, nil, fmt.Errorf("%w %q: unknown version %d (written by a newer delaybridge?)", ErrCorrupt, id, b[0])
	}
	if flags&^flagsKnown != 0 {
		return nil, 0, 0, nil, fmt.Errorf("%w %q: unknown flags %#x (written by a newer delaybridge?)", ErrCorrupt, id, flags)
	}
	m := &Message{ID: id}
	due := d.varint()
	ingested := d.varint()
	m.DueAt = time.UnixMilli(due)
	if flags&flagIngested != 0 {
		m.IngestedAt = time.UnixMilli(due + ingested)
	}
	if ext&extPublished != 0 {
		m.PublishedAt = time.UnixMilli(due + d.varint())
		if ver == codecV3 {
			ns := d.uvarint()
			if ns >= uint64(time.Millisecond) && d.err == nil {
				d.err = fmt.Errorf("published at has %d ns within its millisecond", ns)
			}
			m.PublishedAt = m.PublishedAt.Add(time.Duration(ns))
		}
	}
	m.Priority = d.byte()
	m.Sink = d.string()
	m.Destination = d.string()
	m.Ingest = d.string()
	if flags&flagSource != 0 {
		m.Source = d.string()
	}
	if ext&extOrigin != 0 {
		m.Origin.Log = d.string()
		m.Origin.Pos = d.uvarint()
		if m.Origin.Log == "" && d.err == nil {
			// Encode writes an origin only with its log: a position
			// without one would be lost by the next write.
			d.err = errors.New("an origin position without its log")
		}
	}
	if ext&extPrint != 0 {
		m.Origin.Print = d.uint64()
	}
	if ext&extGroup != 0 {
		m.Group = d.string() // with flagHidden its token, until the private part is read
	}
	if flags&flagHidden == 0 {
		d.schedule(m, flags, ext)
	}
	if d.err != nil {
		return nil, 0, 0, nil, fmt.Errorf("%w %q: %v", ErrCorrupt, id, d.err)
	}
	return m, flags, ext, d, nil
}

// schedule reads the recurrence and its missed_max (appendSchedule) into
// m, when it has them.
func (d *decoder) schedule(m *Message, flags, ext byte) {
	if ext&extRecur == 0 {
		return
	}
	m.Recur = d.recur()
	if flags&flagMissed != 0 {
		m.Recur.MissedMax = int(min(d.uvarint(), 1<<31))
	}
	m.Recur.Parked = m.IngestedAt // derived, not stored apart
}

// headers reads a header list (see the encoding), each with a native value
// when native is set and a null mark when nulls is.
func (d *decoder) headers(native, nulls bool) Headers {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) { // every header takes at least 2 bytes
		d.err = fmt.Errorf("header count %d exceeds remaining %d bytes", n, len(d.b))
	}
	if d.err != nil || n == 0 {
		return nil
	}
	h := make(Headers, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		kv := Header{Key: d.string(), Value: d.string()}
		if native {
			kv.Native = d.string()
		}
		if nulls {
			switch d.byte() {
			case 0:
			case 1:
				kv.Null = true
			default:
				if d.err == nil {
					d.err = errors.New("a null mark that is neither 0 nor 1")
				}
			}
		}
		h = append(h, kv)
	}
	return h
}

// recur reads a recurrence (see appendRecur).
func (d *decoder) recur() *Recurrence {
	r := &Recurrence{}
	r.Every = time.Duration(d.varint()) * time.Millisecond
	r.Cron = d.string()
	r.TimeZone = d.string()
	r.Anchor = time.UnixMilli(d.varint())
	if until := d.varint(); until != 0 {
		r.Until = time.UnixMilli(until)
	}
	r.Count = int(min(d.uvarint(), 1<<31))
	r.N = int(min(d.uvarint(), 1<<31))
	r.Missed = Missed(d.byte())
	if d.err == nil && r.Missed > MissedSkip {
		d.err = fmt.Errorf("unknown missed policy %d", r.Missed)
	}
	return r
}

type decoder struct {
	b []byte
	// src, when not empty, is the whole buffer b is the rest of, as a
	// string: string() returns parts of it instead of copies.
	src string
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

func (d *decoder) uint64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.err = errors.New("truncated")
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
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
	var s string
	if d.src != "" {
		off := len(d.src) - len(d.b)
		s = d.src[off : off+int(n)]
	} else {
		s = string(d.b[:n])
	}
	d.b = d.b[n:]
	return s
}
