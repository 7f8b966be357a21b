package envelope

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// gcmSealer is a Sealer for the tests of this package (pkg/seal imports
// envelope, so it cannot be used here): AES-256-GCM, 12-byte random nonce,
// the layout of pkg/seal's Keyring.
type gcmSealer struct {
	active string
	aeads  map[string]cipher.AEAD
}

func newGCMSealer(active string, ids ...string) *gcmSealer {
	s := &gcmSealer{active: active, aeads: map[string]cipher.AEAD{}}
	for _, id := range ids {
		key := make([]byte, 32)
		copy(key, id) // a key per ID, the same in every test
		block, err := aes.NewCipher(key)
		if err != nil {
			panic(err)
		}
		s.aeads[id], err = cipher.NewGCM(block)
		if err != nil {
			panic(err)
		}
	}
	return s
}

func (s *gcmSealer) KeyID() string { return s.active }

// Hash is HMAC-SHA-256 keyed with the key ID itself: a fixed key per ID,
// as the AEAD keys are.
func (s *gcmSealer) Hash(keyID string, value []byte) ([]byte, bool) {
	if _, ok := s.aeads[keyID]; !ok {
		return nil, false
	}
	h := hmac.New(sha256.New, []byte("index "+keyID))
	h.Write(value)
	return h.Sum(nil), true
}

func (s *gcmSealer) KeyIDs() []string {
	ids := make([]string, 0, len(s.aeads))
	for id := range s.aeads {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (s *gcmSealer) Seal(dst, plaintext, aad []byte) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, 12)...)
	_, _ = rand.Read(dst[n:])
	return s.aeads[s.active].Seal(dst, dst[n:], plaintext, aad)
}

func (s *gcmSealer) Open(dst []byte, keyID string, sealed, aad []byte) ([]byte, error) {
	aead, ok := s.aeads[keyID]
	if !ok {
		return nil, fmt.Errorf("sealed with key %q, which is not configured", keyID)
	}
	if len(sealed) < 12 {
		return nil, errors.New("too short")
	}
	return aead.Open(dst, sealed[:12], sealed[12:], aad)
}

var (
	sealK1 = Codec{Sealer: newGCMSealer("k1", "k1")}
	sealK2 = Codec{Sealer: newGCMSealer("k2", "k1", "k2")} // k1 rotated to k2
	onlyK2 = Codec{Sealer: newGCMSealer("k2", "k2")}
)

// sealedRoundTrip encodes m sealed with c, checks the layout, decodes it
// and compares.
func sealedRoundTrip(t testing.TB, c Codec, m *Message) []byte {
	t.Helper()
	enc := c.Encode(nil, m)
	plain := Encode(nil, m)
	routing := len(plain) - privateLen(m)
	// The routing part is the clear encoding's, with flag bit 2 set.
	if enc[0] != 1 || enc[1] != plain[1]|flagSealed || !bytes.Equal(enc[2:routing], plain[2:routing]) {
		t.Fatalf("routing part differs from the clear encoding:\n% x\n% x", enc[:routing], plain[:routing])
	}
	keyID := appendString(nil, c.Sealer.KeyID())
	if !bytes.Equal(enc[routing:routing+len(keyID)], keyID) {
		t.Fatalf("key ID not after the routing part")
	}
	if got, want := len(enc)-routing-len(keyID), 12+privateLen(m)+16; got != want {
		t.Fatalf("sealed part %d bytes, want nonce + %d + tag = %d", got, privateLen(m), want)
	}
	if n := EncodedSize(m) + binary.MaxVarintLen64 + len(c.Sealer.KeyID()) + sealSlack; len(enc) > n {
		t.Fatalf("sealed encoding %d bytes over the documented bound %d", len(enc), n)
	}
	got, err := c.Decode(m.ID, enc)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if diff := diffMessages(m, got); diff != "" {
		t.Fatalf("sealed round trip: %s", diff)
	}
	if id, sealed, err := SealedKeyID(enc); err != nil || !sealed || id != c.Sealer.KeyID() {
		t.Fatalf("SealedKeyID = %q %v %v", id, sealed, err)
	}
	return enc
}

// privateLen is the length of the clear encoding of key, headers and body.
func privateLen(m *Message) int { return len(appendPrivate(nil, m, 0, extFlags(m))) }

func TestSealedRoundTrip(t *testing.T) {
	cases := map[string]func(*Message){
		"full":            func(*Message) {},
		"nil key":         func(m *Message) { m.Key = nil },
		"empty key":       func(m *Message) { m.Key = []byte{} },
		"no headers":      func(m *Message) { m.Headers = nil },
		"empty body":      func(m *Message) { m.Body = nil },
		"1 MB body":       func(m *Message) { m.Body = bytes.Repeat([]byte{7}, 1<<20) },
		"zero IngestedAt": func(m *Message) { m.IngestedAt = time.Time{} },
		"empty ID":        func(m *Message) { m.ID = "" },
		"nothing":         func(m *Message) { *m = Message{DueAt: time.UnixMilli(0)} },
		"binary strings":  func(m *Message) { m.Sink, m.Destination, m.Ingest = "\xff", "a\x00b", strings.Repeat("é", 200) },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			m := fullMessage()
			mod(m)
			enc := sealedRoundTrip(t, sealK1, m)
			// A rotated keyring opens it too.
			got, err := sealK2.Decode(m.ID, enc)
			if err != nil || diffMessages(m, got) != "" {
				t.Fatalf("rotated keyring: %v %s", err, diffMessages(m, got))
			}
			sealedRoundTrip(t, sealK2, m)
		})
	}
}

// Nothing of the key, the headers or the body is stored in clear; the
// routing fields are (operators read them without the key).
func TestSealedHidesPrivateFields(t *testing.T) {
	m := fullMessage()
	m.Key = []byte("KAFKA-KEY-SECRET")
	m.Headers = hdrs("authorization", "Bearer HEADER-SECRET")
	m.Body = []byte("BODY-SECRET-BODY-SECRET")
	enc := sealK1.Encode(nil, m)
	for _, s := range []string{"KAFKA-KEY-SECRET", "HEADER-SECRET", "authorization", "BODY-SECRET"} {
		if bytes.Contains(enc, []byte(s)) {
			t.Errorf("%q is in clear in the sealed encoding", s)
		}
	}
	for _, s := range []string{m.Sink, m.Destination, m.Ingest, "k1"} {
		if !bytes.Contains(enc, []byte(s)) {
			t.Errorf("routing field %q is not readable", s)
		}
	}
	// Two encodings of one message differ (random nonce).
	if bytes.Equal(enc, sealK1.Encode(nil, m)) {
		t.Errorf("two sealed encodings are equal")
	}
}

// Every single-byte change of a sealed blob is detected: in the routing
// part, the key ID, the nonce, the ciphertext and the tag.
func TestSealedTamperDetection(t *testing.T) {
	m := fullMessage()
	enc := sealK1.Encode(nil, m)
	for i := range enc {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			b := append([]byte(nil), enc...)
			b[i] ^= x
			got, err := sealK1.Decode(m.ID, b)
			if err == nil {
				t.Fatalf("byte %d ^ %#x: tampered blob decoded: %+v", i, x, got)
			}
			if !errors.Is(err, ErrCorrupt) || got != nil {
				t.Fatalf("byte %d ^ %#x: %v", i, x, err)
			}
		}
	}
	// Truncation and extension.
	for _, b := range [][]byte{enc[:len(enc)-1], enc[:len(enc)-16], append(append([]byte(nil), enc...), 0)} {
		if _, err := sealK1.Decode(m.ID, b); !errors.Is(err, ErrSealed) {
			t.Fatalf("%d of %d bytes: %v", len(b), len(enc), err)
		}
	}
}

// The blob is bound to its ID and its routing: moving it to another ID or
// rewriting a routing field consistently (a valid encoding) fails with
// ErrSealed.
func TestSealedBoundToIDAndRouting(t *testing.T) {
	m := fullMessage()
	enc := sealK1.Encode(nil, m)
	if _, err := sealK1.Decode("order-43", enc); !errors.Is(err, ErrSealed) || !strings.Contains(err.Error(), `"order-43"`) {
		t.Fatalf("moved to another ID: %v", err)
	}
	if _, err := sealK1.Decode("", enc); !errors.Is(err, ErrSealed) {
		t.Fatalf("moved to the empty ID: %v", err)
	}
	// Re-route: replace the routing part with another message's (a valid
	// encoding), keeping key ID and sealed part.
	plain := Encode(nil, m)
	routing := len(plain) - privateLen(m)
	rest := enc[routing:]
	mods := map[string]func(*Message){
		"destination": func(m *Message) { m.Destination = "attacker.topic" },
		"sink":        func(m *Message) { m.Sink = "kafka" },
		"ingest":      func(m *Message) { m.Ingest = "other-in" },
		"due":         func(m *Message) { m.DueAt = m.DueAt.Add(-time.Hour) },
		"ingested":    func(m *Message) { m.IngestedAt = time.Time{} },
		"priority":    func(m *Message) { m.Priority = 9 },
		"key flag":    func(m *Message) { m.Key = nil },
	}
	for name, mod := range mods {
		m2 := fullMessage()
		mod(m2)
		p2 := Encode(nil, m2)
		r2 := append([]byte(nil), p2[:len(p2)-privateLen(m2)]...)
		r2[1] |= flagSealed
		b := append(r2, rest...)
		if _, err := sealK1.Decode(m.ID, b); !errors.Is(err, ErrSealed) {
			t.Errorf("%s changed: %v", name, err)
		}
	}
	// Splice: the sealed part of another message (same routing, other ID)
	// under this one's routing part.
	other := fullMessage()
	other.ID, other.Body = "order-99", []byte("other body")
	encOther := sealK1.Encode(nil, other)
	b := append(append([]byte(nil), enc[:routing+3]...), encOther[routing+3:]...) // +3: the key ID "k1"
	if _, err := sealK1.Decode(m.ID, b); !errors.Is(err, ErrSealed) {
		t.Fatalf("spliced: %v", err)
	}
	// Key ID rewritten to another configured key.
	b = append([]byte(nil), enc...)
	copy(b[routing+1:], "k2")
	if _, err := sealK2.Decode(m.ID, b); !errors.Is(err, ErrSealed) {
		t.Fatalf("key ID changed: %v", err)
	}
}

func TestSealedUnknownKeyAndNoSealer(t *testing.T) {
	m := fullMessage()
	enc := sealK1.Encode(nil, m)
	_, err := onlyK2.Decode(m.ID, enc)
	if !errors.Is(err, ErrSealed) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("unknown key: %v", err)
	}
	if want := `"order-42": sealed with key "k1", which is not configured`; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
	_, err = Decode(m.ID, enc)
	if !errors.Is(err, ErrSealed) || !strings.Contains(err.Error(), `sealed with key "k1", but encryption is not configured`) {
		t.Fatalf("no sealer: %v", err)
	}
	_, err = Codec{}.Decode(m.ID, enc)
	if !errors.Is(err, ErrSealed) {
		t.Fatalf("zero Codec: %v", err)
	}
}

// Messages stored in clear before encryption was turned on still decode.
func TestSealerReadsClearMessages(t *testing.T) {
	m := fullMessage()
	got, err := sealK1.Decode(m.ID, Encode(nil, m))
	if err != nil || diffMessages(m, got) != "" {
		t.Fatalf("clear message with a sealer: %v %s", err, diffMessages(m, got))
	}
	if _, sealed, err := SealedKeyID(Encode(nil, m)); sealed || err != nil {
		t.Fatalf("SealedKeyID of a clear message: %v %v", sealed, err)
	}
}

func TestSealedKeyIDCorrupt(t *testing.T) {
	enc := sealK1.Encode(nil, fullMessage())
	routing := len(Encode(nil, fullMessage())) - privateLen(fullMessage())
	for _, b := range [][]byte{nil, {1}, {2, 0}, {1, 0x08}, enc[:routing], enc[:routing+1], enc[:5]} {
		if _, _, err := SealedKeyID(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("SealedKeyID(% x) = %v, want ErrCorrupt", b, err)
		}
		if _, err := sealK1.Decode("id", b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Decode(% x) = %v, want ErrCorrupt", b, err)
		}
	}
}

// checkReencodeSealed is checkReencode for a sealed codec: the message seals
// again and opens to the same message.
func checkReencodeSealed(t testing.TB, c Codec, m *Message) {
	t.Helper()
	enc := c.Encode(nil, m)
	m2, err := c.Decode(m.ID, enc)
	if err != nil {
		t.Fatalf("re-sealed message does not open: %v", err)
	}
	if diff := diffMessages(m, m2); diff != "" {
		t.Fatalf("re-seal round trip: %s", diff)
	}
	if _, err := c.Decode(m.ID+"x", enc); !errors.Is(err, ErrSealed) {
		t.Fatalf("re-sealed message opens under another ID: %v", err)
	}
}

// scheduledMessage is fullMessage with a group and a cron schedule.
func scheduledMessage() *Message {
	m := fullMessage()
	m.Group = "GROUP-SECRET-cart-7"
	m.Recur = &Recurrence{Cron: "17 9 * * 1-5", TimeZone: "America/New_York", Anchor: codecDue, Until: codecDue.Add(48 * time.Hour),
		Count: 12, N: 2, Missed: MissedAll, MissedMax: 7, Parked: m.IngestedAt}
	return m
}

// With encryption, a message's group and schedule are sealed with its
// content: the stored form holds the group's index token (a
// keyed hash, the same for the same group and key), and nothing of the
// cron, the zone, the interval, the end or the count; it opens to the same
// message, with the active key and with a rotated keyring, and every
// single-byte change of it is detected.
func TestSealedHidesGroupAndSchedule(t *testing.T) {
	every := scheduledMessage()
	every.Recur = &Recurrence{Every: 1234567 * time.Millisecond, Anchor: codecDue, N: 1, Parked: every.IngestedAt}
	for _, m := range []*Message{scheduledMessage(), every} {
		enc := sealK1.Encode(nil, m)
		if enc[0] != codecV3 || enc[1]&flagHidden == 0 {
			t.Fatalf("version %d flags %#x, want version 3 with flag bit 6", enc[0], enc[1])
		}
		for _, s := range []string{"GROUP-SECRET", "17 9 * * 1-5", "America/New_York"} {
			if bytes.Contains(enc, []byte(s)) {
				t.Errorf("%q is in clear in the sealed encoding", s)
			}
		}
		for _, v := range []int64{m.Recur.Every.Milliseconds(), m.Recur.Until.UnixMilli(), m.Recur.Anchor.UnixMilli()} {
			if v != 0 && v != m.DueAt.UnixMilli() && bytes.Contains(enc, binary.AppendVarint(nil, v)) {
				t.Errorf("the schedule's %d is in clear", v)
			}
		}
		token := sealK1.GroupIndex(m.Group)
		if !strings.HasPrefix(token, groupIndexMark) || len(token) != 23 || !bytes.Contains(enc, []byte(token)) {
			t.Fatalf("group field is not the index token %q: % x", token, enc)
		}
		if token != sealK2.groupToken("k1", m.Group) || token == sealK2.GroupIndex(m.Group) || token == sealK1.GroupIndex("GROUP-SECRET-cart-8") {
			t.Fatalf("a token is not one per group and key")
		}
		if forms := sealK2.GroupIndexes(m.Group); len(forms) != 3 || forms[0] != m.Group || !slicesContains(forms, token) {
			t.Fatalf("GroupIndexes %q: want the group, and its token under k1 and k2", forms)
		}
		if n := EncodedSize(m) + binary.MaxVarintLen64 + len("k1") + sealSlack; len(enc) > n {
			t.Fatalf("sealed encoding %d bytes over the documented bound %d", len(enc), n)
		}
		if id, sealed, err := SealedKeyID(enc); err != nil || !sealed || id != "k1" {
			t.Fatalf("SealedKeyID = %q %v %v", id, sealed, err)
		}
		checkReencodeSealed(t, sealK1, m)
		if got, err := sealK2.Decode(m.ID, enc); err != nil || diffMessages(m, got) != "" {
			t.Fatalf("rotated keyring: %v %s", err, diffMessages(m, got))
		}
		for i := range enc {
			b := append([]byte(nil), enc...)
			b[i] ^= 0x01
			if got, err := sealK1.Decode(m.ID, b); !errors.Is(err, ErrCorrupt) || got != nil {
				t.Fatalf("byte %d changed: %v %+v", i, err, got)
			}
		}
		// The flag on a message in clear is corrupt, not read as one.
		plain := Encode(nil, m)
		plain[1] |= flagHidden
		if _, err := sealK1.Decode(m.ID, plain); !errors.Is(err, ErrCorrupt) {
			t.Errorf("flag bit 6 without bit 2: %v", err)
		}
	}
	// Without a group or a schedule, a sealed message is written as before.
	if enc := sealK1.Encode(nil, fullMessage()); enc[1]&flagHidden != 0 || enc[0] != codecV1 {
		t.Errorf("a message without group or schedule: version %d flags %#x", enc[0], enc[1])
	}
	if sealK1.GroupIndex("") != "" || (Codec{}).GroupIndex("g") != "g" || len((Codec{}).GroupIndexes("g")) != 1 {
		t.Errorf("GroupIndex without a group or without a Sealer")
	}
}

func slicesContains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Messages sealed without flag bit 6 (group and schedule in clear) still open
// to what they were, and sealing them again hides their group and schedule.
func TestOpensSealedBlobsOfTheVersionBefore(t *testing.T) {
	blobs := GoldenBlobs(t, "testdata/sealed-v3.txt")
	for _, want := range GoldenMessages() {
		b, ok := blobs[want.ID]
		if !ok {
			t.Fatalf("no blob for %s", want.ID)
		}
		if b[1]&flagSealed == 0 || b[1]&flagHidden != 0 {
			t.Fatalf("%s: flags %#x, not a blob of the version before", want.ID, b[1])
		}
		got, err := sealK1.Decode(want.ID, b)
		if err != nil {
			t.Fatalf("%s: %v", want.ID, err)
		}
		if want.Recur != nil {
			want.Recur.Parked = want.IngestedAt
		}
		if d := diffMessages(want, got); d != "" {
			t.Errorf("%s: %s", want.ID, d)
		}
		again := sealK1.Encode(nil, got)
		if hidden := again[1]&flagHidden != 0; hidden != (want.Group != "" || want.Recur != nil) {
			t.Errorf("%s sealed again: flags %#x", want.ID, again[1])
		}
		if want.Group != "" && bytes.Contains(again, []byte(want.Group)) {
			t.Errorf("%s sealed again keeps its group in clear", want.ID)
		}
		checkReencodeSealed(t, sealK1, got)
	}
}

// A reason stored beside a message (its dead reason, its last error) is
// sealed with encryption on, bound to the message's ID: it quotes what the
// message carried. One in clear reads as it is; one that cannot be opened
// says so.
func TestSealedReason(t *testing.T) {
	const reason = `x-delay-cron "SECRET-CRON" is not a 5- or 6-field cron expression`
	stored := sealK1.SealReason("order-42", reason)
	if strings.Contains(stored, "SECRET") || !strings.HasPrefix(stored, reasonMark+"k1"+reasonMark) {
		t.Fatalf("stored %q", stored)
	}
	for _, c := range []Codec{sealK1, sealK2} {
		if got, err := c.OpenReason("order-42", stored); err != nil || got != reason {
			t.Fatalf("opened %q %v", got, err)
		}
	}
	if got, err := sealK1.OpenReason("order-42", "in clear"); err != nil || got != "in clear" {
		t.Fatalf("a reason in clear: %q %v", got, err)
	}
	for name, c := range map[string]struct {
		codec Codec
		id    string
	}{"other ID": {sealK1, "order-43"}, "unknown key": {onlyK2, "order-42"}, "no sealer": {Codec{}, "order-42"}} {
		got, err := c.codec.OpenReason(c.id, stored)
		if !errors.Is(err, ErrSealed) || !strings.Contains(got, `sealed with key "k1" and cannot be read`) || strings.Contains(got, "SECRET") {
			t.Errorf("%s: %q %v", name, got, err)
		}
	}
	if (Codec{}).SealReason("x", reason) != reason || sealK1.SealReason("x", "") != "" {
		t.Errorf("SealReason without a Sealer, or of no reason")
	}
}
