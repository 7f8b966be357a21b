package store

import (
	"hash/fnv"
	"strconv"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Keys builds every Redis key delaybridge uses. All names come from here.
//
// Per shard N (0 <= N < shards), every key carries the Redis Cluster hash
// tag {N}, so that every script touches one slot (a script names the keys
// it touches: scripts.go). docs/store.md shows each key with redis-cli, and
// the states of a message:
//
//	<prefix>:{N}:pool   hash   message ID -> encoded message (envelope.Encode)
//	<prefix>:{N}:due    zset   message ID -> due time, Unix ms. In layout 1
//	                           (layout.go) every state but dead: while a
//	                           message is in flight, its lease expiry +
//	                           leaseMark; while it is claimed ahead of its due
//	                           time, its lease expiry + aheadMark; while it
//	                           waits for a max_rate slot, the slot + slotMark;
//	                           while it is held, in its sink's hold band
//	                           (below). In layout 2, parked messages only.
//	<prefix>:{N}:inflight, :ahead, :slot (and :inflight:pK...)
//	                    zset   layout 2: message ID -> its lease's expiry (in
//	                           flight; claimed ahead), the slot (waiting for a
//	                           max_rate slot), Unix ms
//	<prefix>:{N}:held:<band> (and :held:<band>:pK...)
//	                    zset   layout 2: message ID -> due time, of the
//	                           messages of a priority held for the sink of
//	                           that band
//	<prefix>:{N}:holding hash  layout 2: held message ID -> "<band>:<priority>"
//	<prefix>:{N}:layout string "2": the shard is in layout 2; "1" (after
//	                           migrate down): in layout 1; none: in layout 1
//	                           if it holds messages, else the first layout-2
//	                           script to run there marks it "2"
//	<prefix>:{N}:meta   hash   message ID -> "attempts|deadAt|priority|reason",
//	                           only once there is something to record (a failed
//	                           or abandoned attempt, a death)
//	<prefix>:{N}:dead   zset   message ID -> time it died, Unix ms
//	<prefix>:{N}:deadby zset   "<source>/<time it died, 13 digits>/<ID>" -> 0:
//	                           the dead messages by source, oldest first,
//	                           found by range (what limits.max_dead_messages
//	                           deletes first: lua/lib/life.lua trimdead)
//	<prefix>:{N}:due:pK zset   like due, for messages of x-delay-priority K
//	                           (1..9); priority 0, the default, uses due
//	<prefix>:{N}:groups zset   "<group>\x00<message ID>" -> 0: the messages of
//	                           each group (x-delay-group), found by range
//	<prefix>:{N}:next   hash   message ID -> what waits for the version in
//	                           flight: an encoded replacement (x-delay-replace),
//	                           parked when that version is done; or "F" and a
//	                           new message of that ID that came while it was
//	                           in flight (a follower), parked when that version
//	                           is delivered or dead, not when it is retried
//	<prefix>:{N}:lease  string the expiry (Unix ms) of the shard's last
//	                           claim that took a message: each claim's lease
//	                           ends at least 1 ms after that one, so that a
//	                           lease's expiry identifies it alone
//	<prefix>:{N}:series set    the IDs of the shard's live recurring series
//	                           (parked or in flight, not dead): counted,
//	                           every shard's, against limits.max_series
//	<prefix>:{N}:tally  hash   what each source (an ingest's name; "" the
//	                           admin API) holds in the shard: "p:<source>" ->
//	                           its live messages (parked, in flight or held;
//	                           not dead), "s:<source>" -> its live series,
//	                           "d:<source>" -> its dead messages (in deadby),
//	                           "census" -> when the counts were made from the
//	                           shard's messages (lua/census.lua); kept by
//	                           every script since (lua/lib/tally.lua)
//	<prefix>:{N}:seen:<B> hash "<L>:<log>:<ID>" -> mark, for
//	                           scheduler.dedupe_window W: what re-reads are
//	                           told by, in bucket B = (time in Unix ms) / W,
//	                           read while B-1, B or B+1 is current and expiring
//	                           whole three windows after it began (Store.seen):
//	                           a delivered message of that ID read from
//	                           log (L bytes long; "" without one) and its
//	                           position in the log; without a log (AMQP), the
//	                           content print of a delivery parked and not yet
//	                           confirmed acked (see envelope.Origin)
//	<prefix>:{N}:done:<L>:<log>:<ID>
//	                           the same as one string with a TTL, as builds
//	                           before the seen buckets wrote it: read, never
//	                           written, until the last ones expire
//
// and for the whole deployment:
//
//	<prefix>:config     hash   shards -> the shard count, fixed on first start;
//	                           layout -> the layout the store holds (layout.go);
//	                           cursor_key -> the key that signs listing cursors,
//	                           made once (browse.go)
//	<prefix>:sinks      hash   "index:<sink>" -> the sink's hold band (below);
//	                           "bands" -> how many bands were given;
//	                           "paused:<sink>" -> 1 while the sink is paused
//	<prefix>:rate:<sink> string the next free publish slot of a sink with
//	                           max_rate (Unix µs), shared by every instance;
//	                           it expires a second after that slot
//
// A parked message is in pool and in one due set; a dead one is in pool and
// in dead. A due message of a sink that is down or paused is held: its score
// moves up into the sink's band, HoldBand*(1+index) + due time, far beyond
// any due time, so nothing claims it, and back when the sink can take it
// again; within the band the order of due times is kept.
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

// MaxPriority is the highest x-delay-priority (envelope.MaxPriority): due
// sets exist for 0 to it.
const MaxPriority = envelope.MaxPriority

// DueAt is the due set of a shard for a priority: Due for 0, due:pK for K.
func (k Keys) DueAt(shard, priority int) string { return k.atPriority(shard, "due", priority) }

// DueSets are the due sets of a shard, for priorities 0 to MaxPriority.
func (k Keys) DueSets(shard int) []string {
	out := make([]string, MaxPriority+1)
	for p := range out {
		out[p] = k.DueAt(shard, p)
	}
	return out
}

// InflightAt is, in layout 2, the sorted set of a shard's messages of a
// priority in flight, by their lease's expiry (ms); inflight for 0,
// inflight:pK for K.
func (k Keys) InflightAt(shard, priority int) string {
	return k.atPriority(shard, "inflight", priority)
}

// AheadAt is, in layout 2, the sorted set of a shard's messages of a
// priority claimed ahead of their due time, by their lease's expiry.
func (k Keys) AheadAt(shard, priority int) string { return k.atPriority(shard, "ahead", priority) }

// SlotAt is, in layout 2, the sorted set of a shard's messages of a
// priority waiting for a max_rate publish slot, by the slot (ms).
func (k Keys) SlotAt(shard, priority int) string { return k.atPriority(shard, "slot", priority) }

func (k Keys) atPriority(shard int, name string, priority int) string {
	if priority == 0 {
		return k.shardKey(shard, name)
	}
	return k.shardKey(shard, name+":p"+strconv.Itoa(priority))
}

// HeldAt is, in layout 2, the sorted set of a shard's messages of a
// priority held for the sink of hold band band (SinkState.Band), by due
// time: held:<band> for priority 0, held:<band>:pK for K.
func (k Keys) HeldAt(shard, band, priority int) string {
	key := k.heldPrefix(shard) + strconv.Itoa(band)
	if priority == 0 {
		return key
	}
	return key + ":p" + strconv.Itoa(priority)
}

// HeldSets are, in layout 2, the held sets of a shard's band, for
// priorities 0 to MaxPriority.
func (k Keys) HeldSets(shard, band int) []string {
	out := make([]string, MaxPriority+1)
	for p := range out {
		out[p] = k.HeldAt(shard, band, p)
	}
	return out
}

// heldPrefix is what HeldAt appends the band and priority to; the scripts
// get it as K.held and do the same (lua/lib/heldkey.lua).
func (k Keys) heldPrefix(shard int) string { return k.shardKey(shard, "held:") }

// Holding is, in layout 2, the hash of a shard's held messages: ID ->
// "<band>:<priority>", where each is held (HeldAt) and the due set it goes
// back to.
func (k Keys) Holding(shard int) string { return k.shardKey(shard, "holding") }

// LeaseSets are, in layout 2, the sets of a shard whose times are when a
// lease or a publish slot ends: for each priority, InflightAt, AheadAt and
// SlotAt. With DueSets, they are what a claim takes from.
func (k Keys) LeaseSets(shard int) []string {
	out := make([]string, 0, 3*(MaxPriority+1))
	for p := 0; p <= MaxPriority; p++ {
		out = append(out, k.InflightAt(shard, p), k.AheadAt(shard, p), k.SlotAt(shard, p))
	}
	return out
}

// Groups is the index of a shard's messages by group.
func (k Keys) Groups(shard int) string { return k.shardKey(shard, "groups") }

// Next is the hash of a shard's replacements waiting for the version in
// flight.
func (k Keys) Next(shard int) string { return k.shardKey(shard, "next") }

// Lease is the expiry of a shard's last claim that took a message.
func (k Keys) Lease(shard int) string { return k.shardKey(shard, "lease") }

// Series is the set of a shard's live recurring series.
func (k Keys) Series(shard int) string { return k.shardKey(shard, "series") }

// Tally is the hash of what each source holds in a shard: its live
// messages and series (ingest[].max_parked, ingest[].max_series).
func (k Keys) Tally(shard int) string { return k.shardKey(shard, "tally") }

// DeadBy is shard's index of its dead messages by source and time of
// death (lua/lib/dead.lua).
func (k Keys) DeadBy(shard int) string { return k.shardKey(shard, "deadby") }

// Unconfirmed is the hash of a shard's messages a publish of which was
// sent and never confirmed: ID -> the SHA-1 of the message as it was sent
// (lua/lib/unconfirmed.lua). A cancel or a change meets them as in flight.
func (k Keys) Unconfirmed(shard int) string { return k.shardKey(shard, "unconfirmed") }

// LayoutMark is the marker of a shard's layout (layout.go): "2" in layout
// 2; "1", which migrate down leaves, or none in layout 1.
func (k Keys) LayoutMark(shard int) string { return k.shardKey(shard, "layout") }

// Done is the key an earlier build wrote to remember a delivered message
// of ID id read from log (envelope.Origin.Log, "" for none) for the
// dedupe window; this one reads it until it expires, and writes Seen.
func (k Keys) Done(shard int, id, log string) string {
	return k.doneOf(shard, SeenField(id, log))
}

// doneOf is the Done key of a message whose SeenField is field.
func (k Keys) doneOf(shard int, field string) string { return k.shardKey(shard, "done:"+field) }

// Seen is bucket b of the dedupe window of a shard: the marks of the
// messages that came in that window's span of time (Store.seen).
func (k Keys) Seen(shard int, b int64) string {
	return k.shardKey(shard, "seen:"+strconv.FormatInt(b, 10))
}

// SeenField is the field of a message of ID id read from log in a Seen
// bucket.
func SeenField(id, log string) string {
	return strconv.Itoa(len(log)) + ":" + log + ":" + id
}

// Config is the deployment-wide settings hash.
func (k Keys) Config() string { return k.prefix + ":config" }

// Sinks is the deployment-wide hash of sink hold bands and pause flags.
func (k Keys) Sinks() string { return k.prefix + ":sinks" }

// Rate is the shared publish-slot clock of a sink with max_rate.
func (k Keys) Rate(sink string) string { return k.prefix + ":rate:" + sink }

// ShardOf returns the shard of a message ID: FNV-1a (32 bit) of the ID's
// bytes modulo the shard count. It is stable across versions and processes;
// lookups and cancels need no index.
func ShardOf(id string, shards int) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(shards))
}
