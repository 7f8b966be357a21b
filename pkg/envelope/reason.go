package envelope

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// A message's reason (why it is dead, the error of its last attempt) is
// stored beside it (pkg/store's meta), and may quote what the message
// carried: an unparsable x-delay, x-delay-cron or x-delay-timezone value,
// what a destination template expanded a header to. With a Sealer it is
// sealed like the message (SealReason), bound to the message's ID:
//
//	"\x01" key ID "\x01" base64 (standard, unpadded) of Sealer.Seal(reason)
//
// with the additional authenticated data "delaybridge reason\x00" and the
// ID. A reason in clear (stored before encryption, or without it) reads as
// it is.

// reasonMark starts a sealed reason: no reason delaybridge writes starts
// with a control character.
const reasonMark = "\x01"

func reasonAAD(id string) []byte { return append([]byte("delaybridge reason\x00"), id...) }

// SealReason is the stored form of reason, a reason of the message id:
// sealed with c's Sealer, else reason itself ("" stays "").
func (c Codec) SealReason(id, reason string) string {
	if c.Sealer == nil || reason == "" {
		return reason
	}
	sealed := c.Sealer.Seal(nil, []byte(reason), reasonAAD(id))
	return reasonMark + c.Sealer.KeyID() + reasonMark + base64.RawStdEncoding.EncodeToString(sealed)
}

// OpenReason is the reason whose stored form SealReason made for id. One
// that cannot be opened (no Sealer, a key not configured, altered) reads
// as a sentence that says so, with the error.
func (c Codec) OpenReason(id, stored string) (string, error) {
	keyID, sealed, ok := SealedReason(stored)
	if !ok {
		return stored, nil
	}
	fail := func(err error) (string, error) {
		return fmt.Sprintf("(the reason is sealed with key %q and cannot be read: %v)", keyID, err), fmt.Errorf("%w %q: its reason: %w", ErrSealed, id, err)
	}
	if c.Sealer == nil {
		return fail(fmt.Errorf("encryption is not configured"))
	}
	b, err := base64.RawStdEncoding.DecodeString(sealed)
	if err != nil {
		return fail(fmt.Errorf("not base64: %v", err))
	}
	plain, err := c.Sealer.Open(nil, keyID, b, reasonAAD(id))
	if err != nil {
		return fail(err)
	}
	return string(plain), nil
}

// SealedReason reports whether a stored reason is sealed, with its key ID
// and its sealed part (base64).
func SealedReason(stored string) (keyID, sealed string, ok bool) {
	rest, ok := strings.CutPrefix(stored, reasonMark)
	if !ok {
		return "", "", false
	}
	keyID, sealed, ok = strings.Cut(rest, reasonMark)
	return keyID, sealed, ok
}
