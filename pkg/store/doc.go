// Package store keeps parked messages in Redis: per shard a pool hash of
// encoded messages and due sets scored by due time (one per priority), with
// the shard's meta, dead, groups, next and lease keys beside them (the
// "Version 1.0" layout; keys.go names every key), moved atomically by Lua
// scripts that each touch one shard, so the same code runs on a single
// Redis and on Redis Cluster. docs/store.md shows the layout as an operator
// sees it with redis-cli: each key, each state of a message and the script
// that moves it there.
//
// Life of a message in a shard:
//
//	park ──> due (score = due time) ──claim──> in flight (score = lease expiry)
//	           ^   ^                             │  │  │  │
//	           │   └──── retry (back-off) ───────┘  │  │  └──dead──> dead set
//	           └─ hold/defer (sink down, max_rate) ─┘  │
//	                                      ack: removed ┘ (or the next
//	                                      occurrence, or what waited, parked)
//
// A claim may also take, ahead of time, what falls due within a short window
// (Ask.Ahead): such a message keeps its place among the parked ones (any
// change to it is a change to a parked message, which takes it from the
// claim), and Commit puts it in flight just before its due instant
// (CommitLead) if nothing changed it since; a change that meets it in
// flight then is answered after the instant. See lua/claim.lua and
// lua/commit.lua.
//
// A lease that expires makes the message due again for any instance, so a
// crashed daemon's claims are recovered without a coordinator. Ack, Retry
// and MarkDead act only on messages still held under the Lease that Claim
// returned (identified by its expiry, unique per shard), so an instance
// that lost its lease cannot undo the work of the instance that took the
// message over.
//
// The files, the per-message path first (a reader of it reads these alone):
//
//	park.go      Park and Reject: the ingest and the admin API park through
//	             lua/park.lua (an import writes through lua/import.lua)
//	claim.go     ClaimAhead (Claim, ClaimAfter) and Commit: a lease's
//	             messages (lua/claim.lua, lua/claimack.lua, lua/commit.lua)
//	settle.go    what became of a lease's messages, in one call: Settle
//	             (lua/settle.lua); outcome.go, hold.go and rate.go hold its
//	             parts and their one-kind forms (Ack, Retry, MarkDead, Hold,
//	             Defer, Postpone)
//	outcome.go   the outcomes Done, RetryAt, Failure: Ack, Retry, MarkDead
//	hold.go      a sink that is down holds its due messages: Hold, Release
//	rate.go      a sink's max_rate: Slots, Defer
//	scripts.go   how the Lua files of lua/ become scripts: their keys by
//	             name, their includes (lua/lib/), the Go constants they use
//	keys.go      every key name
//	store.go     the Store and running scripts
//	clock.go     Redis's clock: Offset, and Clock for whoever has no claim
//	             at hand
//	capacity.go  the ingest's gate at limits.max_parked_messages and
//	             max_redis_memory (NewCapacity); Redis's INFO memory
//
// and the operator's tools beside it:
//
//	inspect.go   Inspect one message    cancel.go   Cancel one message
//	dead.go      the dead messages      stats.go    counts and forecast
//	browse.go    listing in due order   group.go    groups
//	reschedule.go  PATCH and fire       sinkstate.go  hold bands, pauses
//	export.go, import.go  JSON Lines    reencrypt.go  sealing again
package store
