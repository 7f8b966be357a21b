package store

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Sealed is a sealed message of a sample (SampleSealed): its ID, the key
// ID it names, and what opening it with this Store's keys gave (nil when
// it opened).
type Sealed struct {
	ID, KeyID string
	Err       error
}

// SampleSealed opens up to n sealed live messages (dead ones aside: a
// message may have died because an instance could not open it), a few of
// each shard's pool (HSCAN pages of about n/shards), to tell at start
// whether the configured keys open what the store holds: a key ID they do
// not have, or a key whose bytes are not the ones that sealed the messages
// under its ID. Messages in clear are not opened: clear counts the live
// ones the pages read.
func (s *Store) SampleSealed(ctx context.Context, n int) (out []Sealed, clear int, err error) {
	per := max(4, n/s.shards)
	for shard := 0; shard < s.shards && len(out) < n; shard++ {
		kv, _, err := s.rdb.HScan(ctx, s.keys.Pool(shard), 0, "", int64(per)).Result()
		if err != nil && err != redis.Nil {
			return out, clear, fmt.Errorf("store.sample_sealed: shard %d: %w", shard, err)
		}
		var ids []string
		for i := 0; i+1 < len(kv); i += 2 {
			ids = append(ids, kv[i])
		}
		if len(ids) == 0 {
			continue
		}
		dead, err := s.rdb.ZMScore(ctx, s.keys.Dead(shard), ids...).Result()
		if err != nil {
			return out, clear, fmt.Errorf("store.sample_sealed: shard %d: %w", shard, err)
		}
		for i, taken := 0, 0; i+1 < len(kv) && taken < per && len(out) < n; i += 2 {
			if dead[i/2] != 0 {
				continue
			}
			id, blob := kv[i], []byte(kv[i+1])
			keyID, sealed, err := envelope.SealedKeyID(blob)
			if err == nil && !sealed {
				clear++
			}
			if err != nil || !sealed {
				continue
			}
			_, err = s.codec.Decode(id, blob)
			out = append(out, Sealed{ID: id, KeyID: keyID, Err: err})
			taken++
		}
	}
	return out, clear, nil
}
