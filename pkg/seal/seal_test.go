package seal_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/seal"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, seal.KeySize) }

func keyring(t *testing.T, active string, ids ...string) *seal.Keyring {
	t.Helper()
	var keys []seal.Key
	for i, id := range ids {
		keys = append(keys, seal.Key{ID: id, Secret: key(byte(i + 1))})
	}
	k, err := seal.New(active, keys)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestNewRejectsBadKeyrings(t *testing.T) {
	cases := []struct {
		name   string
		active string
		keys   []seal.Key
		want   string
	}{
		{"no keys", "k1", nil, "no keys"},
		{"empty ID", "", []seal.Key{{ID: "", Secret: key(1)}}, "no ID"},
		{"duplicate ID", "k1", []seal.Key{{ID: "k1", Secret: key(1)}, {ID: "k1", Secret: key(2)}}, "twice"},
		{"16-byte key", "k1", []seal.Key{{ID: "k1", Secret: key(1)[:16]}}, "16 bytes"},
		{"33-byte key", "k1", []seal.Key{{ID: "k1", Secret: append(key(1), 0)}}, "33 bytes"},
		{"active not a key", "k9", []seal.Key{{ID: "k1", Secret: key(1)}}, `"k9"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := seal.New(c.active, c.keys)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to mention %q", err, c.want)
			}
		})
	}
}

func TestSealOpenRoundTrip(t *testing.T) {
	k := keyring(t, "k1", "k1")
	if k.KeyID() != "k1" {
		t.Fatalf("KeyID %q", k.KeyID())
	}
	plain := []byte("the body")
	aad := []byte("aad")
	prefix := []byte("prefix")
	sealed := k.Seal(append([]byte(nil), prefix...), plain, aad)
	if !bytes.HasPrefix(sealed, prefix) {
		t.Fatalf("Seal does not append to dst")
	}
	sealed = sealed[len(prefix):]
	if len(sealed) != 12+len(plain)+16 {
		t.Fatalf("sealed %d bytes, want nonce 12 + %d + tag 16", len(sealed), len(plain))
	}
	if bytes.Contains(sealed, plain) {
		t.Fatalf("plaintext in the sealed form")
	}
	got, err := k.Open(nil, "k1", sealed, aad)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	// Empty plaintext and nil aad are fine.
	s2 := k.Seal(nil, nil, nil)
	if got, err := k.Open(nil, "k1", s2, nil); err != nil || len(got) != 0 {
		t.Fatalf("Open of empty = %q, %v", got, err)
	}
}

// The layout is 12 bytes nonce, then what crypto/cipher's GCM seals: any
// AES-GCM implementation can open it with the key.
func TestLayoutIsStandardGCM(t *testing.T) {
	k := keyring(t, "k1", "k1")
	sealed := k.Seal(nil, []byte("interop"), []byte("aad"))
	block, _ := aes.NewCipher(key(1))
	gcm, _ := cipher.NewGCM(block)
	got, err := gcm.Open(nil, sealed[:12], sealed[12:], []byte("aad"))
	if err != nil || string(got) != "interop" {
		t.Fatalf("standard GCM Open = %q, %v", got, err)
	}
}

func TestNoncesDiffer(t *testing.T) {
	k := keyring(t, "k1", "k1")
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		s := k.Seal(nil, []byte("same"), nil)
		nonce := string(s[:12])
		if seen[nonce] {
			t.Fatalf("nonce repeated after %d seals", i)
		}
		seen[nonce] = true
	}
}

func TestOpenFailures(t *testing.T) {
	k := keyring(t, "k1", "k1", "k2")
	sealed := k.Seal(nil, []byte("secret body"), []byte("aad"))
	flip := func(i int) []byte {
		b := append([]byte(nil), sealed...)
		b[i] ^= 1
		return b
	}
	cases := []struct {
		name   string
		keyID  string
		sealed []byte
		aad    string
		is     error
		want   string
	}{
		{"unknown key", "k0", sealed, "aad", seal.ErrUnknownKey, `sealed with key "k0", which is not configured`},
		{"other key", "k2", sealed, "aad", seal.ErrAuth, "k2"},
		{"other aad", "k1", sealed, "aaX", seal.ErrAuth, "altered"},
		{"nonce flipped", "k1", flip(0), "aad", seal.ErrAuth, ""},
		{"ciphertext flipped", "k1", flip(14), "aad", seal.ErrAuth, ""},
		{"tag flipped", "k1", flip(len(sealed) - 1), "aad", seal.ErrAuth, ""},
		{"truncated", "k1", sealed[:len(sealed)-1], "aad", seal.ErrAuth, ""},
		{"shorter than nonce and tag", "k1", sealed[:27], "aad", seal.ErrAuth, "shorter"},
		{"empty", "k1", nil, "aad", seal.ErrAuth, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := k.Open(nil, c.keyID, c.sealed, []byte(c.aad))
			if err == nil {
				t.Fatalf("Open succeeded: %q", got)
			}
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %v mentioning %q", err, c.is, c.want)
			}
		})
	}
}

// Rotation: a keyring with a new active key still opens what the old one
// sealed; one without the old key does not.
func TestRotation(t *testing.T) {
	old := keyring(t, "k1", "k1")
	both := keyring(t, "k2", "k1", "k2")
	onlyNew, err := seal.New("k2", []seal.Key{{ID: "k2", Secret: key(2)}})
	if err != nil {
		t.Fatal(err)
	}
	s1 := old.Seal(nil, []byte("m1"), nil)
	if got, err := both.Open(nil, "k1", s1, nil); err != nil || string(got) != "m1" {
		t.Fatalf("rotated keyring cannot open k1: %q %v", got, err)
	}
	s2 := both.Seal(nil, []byte("m2"), nil)
	if got, err := onlyNew.Open(nil, "k2", s2, nil); err != nil || string(got) != "m2" {
		t.Fatalf("k2 keyring cannot open k2: %q %v", got, err)
	}
	if _, err := onlyNew.Open(nil, "k1", s1, nil); !errors.Is(err, seal.ErrUnknownKey) {
		t.Fatalf("k1 without the key: %v", err)
	}
	if ids := both.KeyIDs(); fmt.Sprint(ids) != "[k1 k2]" {
		t.Fatalf("KeyIDs %v", ids)
	}
}

func TestFromConfig(t *testing.T) {
	b64 := func(b byte) config.Secret { return config.Secret(base64.StdEncoding.EncodeToString(key(b))) }
	k, err := seal.FromConfig(&config.Encryption{ActiveKey: "k2", Keys: []config.EncryptionKey{{ID: "k1", Key: b64(1)}, {ID: "k2", Key: b64(2)}}})
	if err != nil {
		t.Fatal(err)
	}
	if k.KeyID() != "k2" {
		t.Fatalf("active %q", k.KeyID())
	}
	// Key k2 of the config is key(2).
	sealed := k.Seal(nil, []byte("x"), nil)
	block, _ := aes.NewCipher(key(2))
	gcm, _ := cipher.NewGCM(block)
	if _, err := gcm.Open(nil, sealed[:12], sealed[12:], nil); err != nil {
		t.Fatalf("active key is not k2's: %v", err)
	}
	if _, err := seal.FromConfig(nil); err == nil {
		t.Fatalf("FromConfig(nil) succeeded")
	}
	short := config.Secret(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef")))
	_, err = seal.FromConfig(&config.Encryption{ActiveKey: "k1", Keys: []config.EncryptionKey{{ID: "k1", Key: short}}})
	if err == nil || !strings.Contains(err.Error(), "16 bytes") || strings.Contains(err.Error(), short.Reveal()) {
		t.Fatalf("short key: %v", err)
	}
}

// A key's value never appears in an error, whatever is wrong with it.
func TestDecodeKeyNeverShowsTheValue(t *testing.T) {
	for _, v := range []string{"not*base64*at*all", "c2hvcnQ=", base64.StdEncoding.EncodeToString(key(7)) + "A", strings.Repeat("QUFB", 20)} {
		_, err := seal.DecodeKey(v)
		if err == nil {
			t.Fatalf("DecodeKey(%q) succeeded", v)
		}
		if strings.Contains(err.Error(), v) || strings.Contains(err.Error(), v[:8]) {
			t.Fatalf("error shows the value: %v", err)
		}
	}
	if b, err := seal.DecodeKey(base64.StdEncoding.EncodeToString(key(7))); err != nil || !bytes.Equal(b, key(7)) {
		t.Fatalf("DecodeKey of a good key: %v", err)
	}
}

// The Keyring is the envelope's Sealer: a sealed message round-trips and the
// envelope reports the keyring's reasons.
func TestKeyringWithEnvelope(t *testing.T) {
	m := &envelope.Message{
		ID: "order-42", DueAt: time.UnixMilli(1_800_000_000_000), Sink: "s", Destination: "d",
		Key: []byte("kafka-key"), Headers: envelope.Headers{{Key: "h", Value: "header-value"}}, Body: []byte("the-body"),
	}
	enc := envelope.Codec{Sealer: keyring(t, "k1", "k1")}.Encode(nil, m)
	for _, secret := range []string{"kafka-key", "header-value", "the-body"} {
		if bytes.Contains(enc, []byte(secret)) {
			t.Fatalf("%q in clear in the sealed encoding", secret)
		}
	}
	got, err := envelope.Codec{Sealer: keyring(t, "k2", "k1", "k2")}.Decode("order-42", enc)
	if err != nil || string(got.Body) != "the-body" || string(got.Key) != "kafka-key" {
		t.Fatalf("Decode = %+v, %v", got, err)
	}
	onlyK2, _ := seal.New("k2", []seal.Key{{ID: "k2", Secret: key(2)}})
	_, err = envelope.Codec{Sealer: onlyK2}.Decode("order-42", enc)
	if !errors.Is(err, envelope.ErrSealed) || !errors.Is(err, seal.ErrUnknownKey) || !strings.Contains(err.Error(), `sealed with key "k1", which is not configured`) {
		t.Fatalf("unknown key: %v", err)
	}
	_, err = envelope.Codec{Sealer: keyring(t, "k1", "k1")}.Decode("order-43", enc)
	if !errors.Is(err, envelope.ErrSealed) || !errors.Is(err, seal.ErrAuth) {
		t.Fatalf("moved to another ID: %v", err)
	}
}

func TestConcurrentUse(t *testing.T) {
	k := keyring(t, "k1", "k1")
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				p := []byte(fmt.Sprintf("g%d-%d", g, i))
				got, err := k.Open(nil, "k1", k.Seal(nil, p, p), p)
				if err != nil || !bytes.Equal(got, p) {
					t.Errorf("round trip %q: %q %v", p, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// Hash is HMAC-SHA-256 under a key derived from each key's secret (not the
// AES key itself): the same for the same value and key ID, another for
// another key or value, and none for a key ID the Keyring lacks.
func TestHashForTheGroupIndex(t *testing.T) {
	k := keyring(t, "k2", "k1", "k2")
	h1, ok1 := k.Hash("k1", []byte("order-42"))
	again, _ := k.Hash("k1", []byte("order-42"))
	h2, ok2 := k.Hash("k2", []byte("order-42"))
	other, _ := k.Hash("k1", []byte("order-43"))
	if !ok1 || !ok2 || len(h1) != 32 || !bytes.Equal(h1, again) || bytes.Equal(h1, h2) || bytes.Equal(h1, other) {
		t.Fatalf("hashes %x %x %x %x", h1, again, h2, other)
	}
	raw := hmac.New(sha256.New, key(1))
	raw.Write([]byte("order-42"))
	if bytes.Equal(raw.Sum(nil), h1) {
		t.Fatalf("the hash is keyed with the AES key itself")
	}
	only1 := keyring(t, "k1", "k1")
	if h, _ := only1.Hash("k1", []byte("order-42")); !bytes.Equal(h, h1) {
		t.Fatalf("another Keyring with the same key hashes otherwise")
	}
	if _, ok := only1.Hash("k2", []byte("order-42")); ok {
		t.Fatalf("a hash under a key the Keyring lacks")
	}
}
