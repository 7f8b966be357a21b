package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/seal"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// keySample is how many sealed messages a start opens to check its keys.
const keySample = 64

// minWrongKey is how many sampled messages of one key ID must all fail
// authentication, none opening, before a start takes the key's bytes for
// wrong rather than those messages for altered.
const minWrongKey = 3

// checkKeys opens a sample of the store's sealed messages with the
// configured keys (enc nil: none). A key whose bytes open none of at least
// minWrongKey messages sealed under its ID stops the start: the instance
// would kill every such message it claims (dead, authentication failed)
// and seal new ones under that ID that the other instances cannot open.
// Messages sealed with a key ID not configured here are logged at WARN:
// they go dead when this instance claims them (`dead retry` brings them
// back once the key is configured). So are messages in clear under
// encryption.require_sealed, which go dead likewise. A sample Redis does
// not answer is logged and passed over.
func checkKeys(ctx context.Context, st *store.Store, enc *config.Encryption, log *slog.Logger) error {
	sample, clear, err := st.SampleSealed(ctx, keySample)
	if err != nil {
		log.Warn("cannot read a sample of the sealed messages to check the encryption keys; starting without the check", "err", err)
	}
	configured := map[string]bool{}
	if enc != nil {
		for _, k := range enc.Keys {
			configured[k.ID] = true
		}
	}
	opened, failed, missing := map[string]int{}, map[string]int{}, map[string]int{}
	example := map[string]string{} // a message of each key that failed
	for _, m := range sample {
		switch {
		case m.Err == nil:
			opened[m.KeyID]++
		case !configured[m.KeyID] || errors.Is(m.Err, seal.ErrUnknownKey):
			missing[m.KeyID]++
		case errors.Is(m.Err, seal.ErrAuth):
			failed[m.KeyID]++
			example[m.KeyID] = cmp.Or(example[m.KeyID], m.ID)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(failed)) {
		if opened[id] == 0 && failed[id] >= minWrongKey {
			return fmt.Errorf("encryption: key %q opens none of the %d live messages sampled that are sealed under its ID (authentication failed; one is %s): "+
				"its bytes are not those of the key that sealed them, and this instance would kill every such message it claims; "+
				"give encryption.keys the key of that ID (key or key_file), or a new ID for a new key (docs/security.md)", id, failed[id], envelope.DisplayID(example[id]))
		}
	}
	if clear > 0 && enc != nil && enc.RequireSealed {
		log.Warn("the store holds messages in clear, which encryption.require_sealed refuses: each goes dead when it comes due; "+
			"run `delaybridge reencrypt` to seal them (and `delaybridge dead retry` for those dead meanwhile), or turn require_sealed on only after it",
			"in_clear_sampled", clear)
	}
	if len(missing) > 0 {
		log.Warn("the store holds messages sealed with keys this instance does not have: each it claims goes dead (`delaybridge dead retry` brings it back once the key is configured); "+
			"add the keys to encryption.keys on every instance (docs/security.md, rotation)",
			"keys", slices.Sorted(maps.Keys(missing)), "sampled", missing)
	}
	return nil
}
