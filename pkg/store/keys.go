package store

import (
	"hash/fnv"
	"strconv"
)

// Keys builds every Redis key delaybridge uses. All names come from here.
//
// Per shard N (0 <= N < shards), four keys share the Redis Cluster hash tag
// {N}, so that every script touches one slot:
//
//	<prefix>:{N}:pool   hash   message ID -> encoded message (envelope.Encode)
//	<prefix>:{N}:due    zset   message ID -> due time, Unix ms; while a message
//	                           is in flight, its lease expiry + 0.5 instead
//	<prefix>:{N}:meta   hash   message ID -> "attempts|deadAt|priority|reason",
//	                           only once there is something to record (a failed
//	                           or abandoned attempt, a death)
//	<prefix>:{N}:dead   zset   message ID -> time it died, Unix ms
//	<prefix>:{N}:due:pK zset   like due, for messages of x-delay-priority K
//	                           (1..9); priority 0, the default, uses due
//
// and one key for the whole deployment:
//
//	<prefix>:config     hash   shards -> the shard count, fixed on first start
//
// A parked message is in pool and in due; a dead one is in pool and in dead.
type Keys struct {
	prefix string
}

// NewKeys returns the key builder for prefix.
func NewKeys(prefix string) Keys { return Keys{prefix: prefix} }

func (k Keys) shardKey(shard int, name string) string {
	return k.prefix + ":{" + strconv.Itoa(shard) + "}:" + name
}

// Pool is the hash of encoded messages of a shard.
func (k Keys) Pool(shard int) string { return k.shardKey(shard, "pool") }

// Due is the sorted set of a shard's parked messages by due time.
func (k Keys) Due(shard int) string { return k.shardKey(shard, "due") }

// Meta is the hash of a shard's attempt counts, last errors and dead
// reasons, for the messages that have one.
func (k Keys) Meta(shard int) string { return k.shardKey(shard, "meta") }

// Dead is the sorted set of a shard's dead messages by time of death.
func (k Keys) Dead(shard int) string { return k.shardKey(shard, "dead") }

// MaxPriority is the highest x-delay-priority.
const MaxPriority = 9

// DueAt is the due set of a shard for a priority: Due for 0, due:pK for K.
func (k Keys) DueAt(shard, priority int) string {
	if priority == 0 {
		return k.Due(shard)
	}
	return k.shardKey(shard, "due:p"+strconv.Itoa(priority))
}

// Config is the deployment-wide settings hash.
func (k Keys) Config() string { return k.prefix + ":config" }

// shard returns the keys of one shard in the order the scripts expect:
// KEYS[1] pool, KEYS[2] due, KEYS[3] meta, KEYS[4] dead, and KEYS[4+K] the
// due set of priority K (1..9).
func (k Keys) shard(shard int) []string {
	keys := []string{k.Pool(shard), k.Due(shard), k.Meta(shard), k.Dead(shard)}
	for p := 1; p <= MaxPriority; p++ {
		keys = append(keys, k.DueAt(shard, p))
	}
	return keys
}

// ShardOf returns the shard of a message ID: FNV-1a (32 bit) of the ID's
// bytes modulo the shard count. It is stable across versions and processes;
// lookups and cancels need no index.
func ShardOf(id string, shards int) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(shards))
}
