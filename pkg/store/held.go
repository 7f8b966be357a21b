package store

import (
	"context"
	"fmt"
)

// heldCountScript counts a shard's messages held in each hold band given.
//
//	KEYS[1..16] -> the shard's keys
//	ARGV    -> band indexes
//	returns -> one count per band, in order
var heldCountScript = newScript(`
local out = {}
for i, b in ipairs(ARGV) do
  local base = HOLDBAND * (1 + tonumber(b))
  local n = 0
  for p = 0, maxprio() do
    n = n + redis.call('ZCOUNT', zkey(p), base, '(' .. (base + HOLDBAND))
  end
  out[i] = n
end
return out
`)

// HeldBySink counts, per sink (name -> hold band index, from SinkStates),
// the messages held in its band: due, and waiting because the sink is
// paused or down. A sink that takes messages holds none. One script per
// shard, in one pipeline; each count is a ZCOUNT per due set.
func (s *Store) HeldBySink(ctx context.Context, bands map[string]int) (map[string]int64, error) {
	out := make(map[string]int64, len(bands))
	if len(bands) == 0 {
		return out, nil
	}
	names := make([]string, 0, len(bands))
	args := make([]any, 0, len(bands))
	for name, b := range bands {
		names = append(names, name)
		args = append(args, b)
		out[name] = 0
	}
	calls := make([]shardCall, s.shards)
	for i := range calls {
		calls[i] = shardCall{shard: i, args: args}
	}
	for i, cmd := range s.runEach(ctx, "held_count", heldCountScript, calls) {
		res, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("store.held_by_sink shard %d: %w", i, err)
		}
		if len(res) != len(names) {
			return nil, fmt.Errorf("store.held_by_sink shard %d: unexpected reply of %d items", i, len(res))
		}
		for j, n := range res {
			out[names[j]] += n
		}
	}
	return out, nil
}
