package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// ErrNoSealer is returned by Reencrypt on a Store without Options.Sealer.
var ErrNoSealer = errors.New("store: encryption is not configured (add an encryption section with an active_key)")

// replaceScript stores new blobs only where the stored blob is still the one
// read (compare and set), so that a message cancelled, fired, or cancelled
// and parked again meanwhile is never overwritten or brought back.
// (lua/replace.lua has its KEYS, ARGV and reply.)
var replaceScript = loadScript("replace")

// replaceMetaScript stores new meta values where the stored one is still
// the one read. (lua/replacemeta.lua has its KEYS, ARGV and reply.)
var replaceMetaScript = loadScript("replacemeta")

// ReencryptStats counts what Reencrypt did.
type ReencryptStats struct {
	Reencrypted int // sealed again with the active key, Plain of them stored in clear before
	Plain       int
	Current     int // already sealed with the active key
	Failed      int // could not be decoded or opened (key not configured, altered): left as they are
	Changed     int // changed or removed while being re-encrypted (fired, cancelled): left as they are
	// Reasons counts the dead reasons and last errors sealed again with
	// the active key (or for the first time); ReasonsFailed those that
	// could not be opened (left as they are).
	Reasons, ReasonsFailed int
}

// reencryptFlushBytes bounds the blobs sent in one replace script call.
const reencryptFlushBytes = 8 << 20

// Reencrypt seals every parked and dead message that is not sealed with the
// Sealer's active key: per shard it scans the pool (HSCAN, about batch
// messages per call), opens and re-seals each message, and writes it back
// with replaceScript (which moves its group's index entry to the new
// token); then it does the same for the reasons of the shard's meta
// (reencryptReasons). It is safe while daemons run. failed, when set, is
// called for each message that cannot be read. HSCAN may return a message
// twice while the pool grows; it is then counted twice (the second time as
// current).
func (s *Store) Reencrypt(ctx context.Context, batch int, failed func(id string, err error)) (ReencryptStats, error) {
	var st ReencryptStats
	if s.codec.Sealer == nil {
		return st, ErrNoSealer
	}
	if batch <= 0 {
		batch = 100
	}
	active := s.codec.Sealer.KeyID()
	// Sealing what is in clear is this command's job, so it reads clear
	// messages even under RequireSealed.
	lenient := s.codec
	lenient.RequireSealed = false
	for shard := 0; shard < s.shards; shard++ {
		pool := s.keys.Pool(shard)
		var cursor uint64
		for {
			kv, next, err := s.rdb.HScan(ctx, pool, cursor, "", int64(batch)).Result()
			if err != nil {
				return st, fmt.Errorf("store.reencrypt shard %d: %w", shard, err)
			}
			var (
				args  []any
				size  int
				plain []bool
			)
			flush := func() error {
				if len(args) == 0 {
					return nil
				}
				res, err := s.run(ctx, "reencrypt", replaceScript, shard, args...).Int64Slice()
				if err != nil {
					return fmt.Errorf("store.reencrypt shard %d: %w", shard, err)
				}
				for i, v := range res {
					switch {
					case v != 1:
						st.Changed++
					case plain[i]:
						st.Reencrypted++
						st.Plain++
					default:
						st.Reencrypted++
					}
				}
				args, size, plain = args[:0], 0, plain[:0]
				return nil
			}
			for i := 0; i+1 < len(kv); i += 2 {
				id, blob := kv[i], kv[i+1]
				keyID, sealed, err := envelope.SealedKeyID([]byte(blob))
				if err == nil && sealed && keyID == active {
					st.Current++
					continue
				}
				m, err := lenient.Decode(id, []byte(blob))
				if err != nil {
					st.Failed++
					if failed != nil {
						failed(id, err)
					}
					continue
				}
				enc := s.encode(m)
				args = append(args, id, blob, enc)
				plain = append(plain, !sealed)
				if size += len(blob) + len(enc); size >= reencryptFlushBytes {
					if err := flush(); err != nil {
						return st, err
					}
				}
			}
			if err := flush(); err != nil {
				return st, err
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		if err := s.reencryptReasons(ctx, shard, batch, active, &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// reencryptReasons seals the reasons of a shard's meta values that are in
// clear or sealed with another key than active, with replaceMetaScript.
func (s *Store) reencryptReasons(ctx context.Context, shard, batch int, active string, st *ReencryptStats) error {
	key := s.keys.Meta(shard)
	var cursor uint64
	for {
		kv, next, err := s.rdb.HScan(ctx, key, cursor, "", int64(batch)).Result()
		if err != nil {
			return fmt.Errorf("store.reencrypt shard %d meta: %w", shard, err)
		}
		var args []any
		for i := 0; i+1 < len(kv); i += 2 {
			id, v := kv[i], kv[i+1]
			cut := metaReasonAt(v)
			if cut < 0 || cut == len(v) {
				continue // no reason
			}
			stored := v[cut:]
			if keyID, _, sealed := envelope.SealedReason(stored); sealed && keyID == active {
				continue
			}
			reason, err := s.codec.OpenReason(id, stored)
			if err != nil {
				st.ReasonsFailed++
				continue
			}
			args = append(args, id, v, v[:cut]+s.codec.SealReason(id, reason))
		}
		if len(args) > 0 {
			n, err := s.run(ctx, "reencrypt_reasons", replaceMetaScript, shard, args...).Int()
			if err != nil {
				return fmt.Errorf("store.reencrypt shard %d meta: %w", shard, err)
			}
			st.Reasons += n
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// metaReasonAt is where the reason of a meta value starts (after its third
// "|"), -1 for a value that is not one.
func metaReasonAt(v string) int {
	at := 0
	for range 3 {
		i := strings.IndexByte(v[at:], '|')
		if i < 0 {
			return -1
		}
		at += i + 1
	}
	return at
}
