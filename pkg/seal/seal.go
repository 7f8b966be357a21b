// Package seal encrypts parked messages at rest: a Keyring of AES-256-GCM
// keys, each with a constant ID, seals the private part of every message it
// encodes (key, headers, body, group and schedule; see envelope.Codec) with
// its active key and opens messages sealed with any of its keys, so keys
// can be rotated while older messages are still parked. It also hashes a
// sealed message's group for the store's group index, with HMAC-SHA-256
// under a key derived from each key (Hash), so that the index does not show
// the group and a lookup of the group computes the same hash.
//
// Rotation, with several instances in two rollouts: (1) add the new key to
// encryption.keys on every instance, active_key unchanged; (2) make it
// active_key on every instance (new messages are sealed with it, old ones
// still open with the old key); (3) run `delaybridge reencrypt` to move what
// is parked and dead to the new key; (4) remove the old key. Step 1 first,
// or an instance that does not know the new key yet would claim messages
// sealed with it and make them dead. A message sealed with a key that is not
// configured cannot be published: it becomes dead with the reason, and
// `dead retry` brings it back once the key is configured again.
//
// Nonces are 12 random bytes (crypto/rand) per message. Random nonces are
// safe for up to about 2^32 messages per key (NIST SP 800-38D); rotate well
// before that.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// KeySize is the size of an AES-256 key in bytes.
const KeySize = 32

// Errors of Open; the envelope wraps them in envelope.ErrSealed.
var (
	// ErrUnknownKey: the message names a key ID the Keyring does not have.
	ErrUnknownKey = errors.New("seal: unknown key")
	// ErrAuth: authentication failed. The blob was altered, stored under
	// another message ID, or sealed with another key of the same ID.
	ErrAuth = errors.New("seal: authentication failed")
)

// Key is one key of a Keyring.
type Key struct {
	ID     string // stored with every message it seals; must always name the same key
	Secret []byte // KeySize bytes
}

// Keyring seals with its active key and opens with any of its keys. It is
// immutable and safe for concurrent use.
type Keyring struct {
	active string
	aeads  map[string]cipher.AEAD
	hashes map[string][]byte // key ID -> the key Hash uses (hashKey of its secret)
}

var _ envelope.Sealer = (*Keyring)(nil)

// New returns a Keyring of keys whose active key is active.
func New(active string, keys []Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("seal: no keys")
	}
	k := &Keyring{active: active, aeads: make(map[string]cipher.AEAD, len(keys)), hashes: make(map[string][]byte, len(keys))}
	for _, key := range keys {
		if key.ID == "" {
			return nil, errors.New("seal: a key has no ID")
		}
		if _, dup := k.aeads[key.ID]; dup {
			return nil, fmt.Errorf("seal: key ID %q is given twice", key.ID)
		}
		if len(key.Secret) != KeySize {
			return nil, fmt.Errorf("seal: key %q is %d bytes, want %d (AES-256)", key.ID, len(key.Secret), KeySize)
		}
		block, err := aes.NewCipher(key.Secret)
		if err != nil {
			return nil, fmt.Errorf("seal: key %q: %w", key.ID, err)
		}
		aead, err := cipher.NewGCM(block) // 12-byte nonce, 16-byte tag
		if err != nil {
			return nil, fmt.Errorf("seal: key %q: %w", key.ID, err)
		}
		k.aeads[key.ID] = aead
		k.hashes[key.ID] = hashKey(key.Secret)
	}
	if _, ok := k.aeads[active]; !ok {
		return nil, fmt.Errorf("seal: active key %q is not one of the keys", active)
	}
	return k, nil
}

// FromConfig builds the Keyring of the configuration's encryption section,
// which Validate has checked. Key values are standard base64 of KeySize bytes.
func FromConfig(c *config.Encryption) (*Keyring, error) {
	if c == nil {
		return nil, errors.New("seal: encryption is not configured")
	}
	keys := make([]Key, len(c.Keys))
	for i, ck := range c.Keys {
		secret, err := DecodeKey(ck.Key.Reveal())
		if err != nil {
			return nil, fmt.Errorf("seal: encryption.keys[%d] (%s): %w", i, ck.ID, err)
		}
		keys[i] = Key{ID: ck.ID, Secret: secret}
	}
	return New(c.ActiveKey, keys)
}

// DecodeKey decodes a key written as standard base64 (as from
// `openssl rand -base64 32`) and checks its size. The error never shows the
// value.
func DecodeKey(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, errors.New("not valid standard base64 (make one with: openssl rand -base64 32)")
	}
	if len(b) != KeySize {
		return nil, fmt.Errorf("decodes to %d bytes, want %d (AES-256; make one with: openssl rand -base64 32)", len(b), KeySize)
	}
	return b, nil
}

// KeyID returns the active key's ID.
func (k *Keyring) KeyID() string { return k.active }

// KeyIDs returns every key ID, sorted.
func (k *Keyring) KeyIDs() []string {
	ids := make([]string, 0, len(k.aeads))
	for id := range k.aeads {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Seal appends to dst a random nonce, then plaintext encrypted with the
// active key and its tag, authenticating aad.
func (k *Keyring) Seal(dst, plaintext, aad []byte) []byte {
	aead := k.aeads[k.active]
	n := len(dst)
	dst = append(dst, make([]byte, aead.NonceSize())...)
	nonce := dst[n:]
	_, _ = rand.Read(nonce) // never fails (crypto/rand since Go 1.24)
	return aead.Seal(dst, nonce, plaintext, aad)
}

// hashKey derives from a key's secret the key of its hashes, so that the
// AES key itself is never used for anything but AES-GCM.
func hashKey(secret []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("delaybridge group index v1"))
	return h.Sum(nil)
}

// Hash returns HMAC-SHA-256 of value under the hash key of key keyID (32
// bytes); false when keyID is not one of the keys.
func (k *Keyring) Hash(keyID string, value []byte) ([]byte, bool) {
	key, ok := k.hashes[keyID]
	if !ok {
		return nil, false
	}
	h := hmac.New(sha256.New, key)
	h.Write(value)
	return h.Sum(nil), true
}

// Open appends to dst the plaintext of sealed (nonce, ciphertext, tag) made
// by Seal with key keyID and the same aad.
func (k *Keyring) Open(dst []byte, keyID string, sealed, aad []byte) ([]byte, error) {
	aead, ok := k.aeads[keyID]
	if !ok {
		return nil, fmt.Errorf("%w: sealed with key %q, which is not configured (encryption.keys has %q)", ErrUnknownKey, keyID, k.KeyIDs())
	}
	ns := aead.NonceSize()
	if len(sealed) < ns+aead.Overhead() {
		return nil, fmt.Errorf("%w: sealed part of %d bytes is shorter than nonce and tag", ErrAuth, len(sealed))
	}
	out, err := aead.Open(dst, sealed[:ns], sealed[ns:], aad)
	if err != nil {
		return nil, fmt.Errorf("%w with key %q: the stored message was altered, moved to another ID, or sealed with another key named %q", ErrAuth, keyID, keyID)
	}
	return out, nil
}
