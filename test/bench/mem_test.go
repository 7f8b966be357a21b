//go:build bench

package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// MemResult is the Redis memory taken by parked messages of one body size.
type MemResult struct {
	BodyBytes     int     `json:"body_bytes"`
	Messages      int     `json:"messages"`
	IDBytes       int     `json:"id_bytes"`
	EnvelopeBytes int     `json:"envelope_header_bytes"` // encoded message minus body
	UsedMemory0   float64 `json:"used_memory_before"`
	UsedMemory1   float64 `json:"used_memory_after"`
	BytesPerMsg   float64 `json:"bytes_per_msg"`
	OverheadBytes float64 `json:"overhead_per_msg"` // BytesPerMsg - body
	TargetBytes   float64 `json:"target_overhead_bytes"`
	Met           bool    `json:"met"`
	ParkSeconds   float64 `json:"park_seconds"`

	// Where the bytes go, from MEMORY USAGE (SAMPLES 0: exact) of shard 0.
	PoolEncoding      string  `json:"pool_encoding"`
	DueEncoding       string  `json:"due_encoding"`
	PoolBytesPerEntry float64 `json:"pool_bytes_per_entry"`
	DueBytesPerEntry  float64 `json:"due_bytes_per_entry"`
	ShardEntries      int64   `json:"shard0_entries"`

	// Alternatives measured on scratch keys of the same Redis (proposals;
	// the store is unchanged).
	Alternatives []MemAlt `json:"alternatives,omitempty"`
}

// MemAlt is one alternative layout measured for comparison.
type MemAlt struct {
	Name          string  `json:"name"`
	Messages      int     `json:"messages"`
	BytesPerMsg   float64 `json:"bytes_per_msg"`
	OverheadBytes float64 `json:"overhead_per_msg"`
}

const memTarget = 160

// runMemory parks -mem-n messages per body size with store.Park into a
// Redis without persistence (nothing but the data set counts) and reports
// INFO used_memory per message.
func runMemory(t *testing.T, _ *env) []MemResult {
	r := testenv.Redis(t, testenv.WithArgs("--appendonly", "no"))
	rdb := r.Client()
	ctx := context.Background()
	st := store.New(rdb, store.Options{Prefix: "bench", Shards: 16})
	var out []MemResult
	for _, f := range strings.Split(*flagMemBody, ",") {
		size, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("-mem-bodies: %v", err)
		}
		n := *flagMemN
		t.Logf("== Redis memory: %d messages with %d-byte bodies", n, size)
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		_ = rdb.Do(ctx, "MEMORY", "PURGE").Err()
		due := time.Now().Add(365 * 24 * time.Hour)
		m := &envelope.Message{ID: "m-0000001", DueAt: due.Truncate(time.Millisecond), Sink: "out", Destination: "fired.bench",
			Ingest: "in", IngestedAt: time.Now().Truncate(time.Millisecond), Body: make([]byte, size)}
		res := MemResult{BodyBytes: size, Messages: n, IDBytes: len(m.ID), TargetBytes: memTarget,
			EnvelopeBytes: len(envelope.Encode(nil, m)) - size}
		res.UsedMemory0 = redisUsedMemory(t, rdb)
		start := time.Now()
		parkMessages(t, st, n, size, "m", func(int) time.Time { return due })
		res.ParkSeconds = time.Since(start).Seconds()
		res.UsedMemory1 = redisUsedMemory(t, rdb)
		res.BytesPerMsg = (res.UsedMemory1 - res.UsedMemory0) / float64(n)
		res.OverheadBytes = res.BytesPerMsg - float64(size)
		res.Met = res.OverheadBytes <= memTarget

		keys := st.Keys()
		res.PoolEncoding, _ = rdb.ObjectEncoding(ctx, keys.Pool(0)).Result()
		res.DueEncoding, _ = rdb.ObjectEncoding(ctx, keys.Due(0)).Result()
		res.ShardEntries, _ = rdb.HLen(ctx, keys.Pool(0)).Result()
		if res.ShardEntries > 0 {
			pu, _ := rdb.MemoryUsage(ctx, keys.Pool(0), 0).Result()
			du, _ := rdb.MemoryUsage(ctx, keys.Due(0), 0).Result()
			res.PoolBytesPerEntry = float64(pu) / float64(res.ShardEntries)
			res.DueBytesPerEntry = float64(du) / float64(res.ShardEntries)
		}
		res.Alternatives = memAlternatives(t, rdb, size, res.EnvelopeBytes, min(n, 250_000))
		t.Logf("   %.1f B/msg, overhead %.1f B (target %d): pool %s %.1f B/entry, due %s %.1f B/entry",
			res.BytesPerMsg, res.OverheadBytes, memTarget, res.PoolEncoding, res.PoolBytesPerEntry, res.DueEncoding, res.DueBytesPerEntry)
		out = append(out, res)
	}
	_ = rdb.FlushAll(ctx).Err()
	return out
}

// memAlternatives measures layouts that could replace the current one, each
// with n messages of the same IDs and body size on scratch keys (after a
// FLUSHALL). They answer "what would it save", not "does it work": the
// scripts are not rewritten for them.
func memAlternatives(t *testing.T, rdb *redis.Client, body, envBytes, n int) []MemAlt {
	ctx := context.Background()
	val := func(extra int) string { return strings.Repeat("v", body+extra) }
	score := float64(time.Now().Add(365 * 24 * time.Hour).UnixMilli())
	measure := func(name string, fill func(p redis.Pipeliner, i int, id string)) MemAlt {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		m0 := redisUsedMemory(t, rdb)
		for from := 0; from < n; from += 2000 {
			p := rdb.Pipeline()
			for i := from; i < min(from+2000, n); i++ {
				fill(p, i, fmt.Sprintf("m-%07d", i+1))
			}
			if _, err := p.Exec(ctx); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		per := (redisUsedMemory(t, rdb) - m0) / float64(n)
		return MemAlt{Name: name, Messages: n, BytesPerMsg: per, OverheadBytes: per - float64(body)}
	}
	shard := func(id string) int {
		h := fnv.New32a()
		h.Write([]byte(id))
		return int(h.Sum32() % 16)
	}
	var out []MemAlt
	v := val(envBytes)
	// The current layout written with plain HSET/ZADD: checks that the
	// scripts add nothing, and splits the cost between hash and zset.
	out = append(out, measure("current layout (HSET pool + ZADD due, 16 shards)", func(p redis.Pipeliner, _ int, id string) {
		s := strconv.Itoa(shard(id))
		p.HSet(ctx, "x:{"+s+"}:pool", id, v)
		p.ZAdd(ctx, "x:{"+s+"}:due", redis.Z{Score: score, Member: id})
	}))
	out = append(out, measure("pool hash only", func(p redis.Pipeliner, _ int, id string) {
		p.HSet(ctx, "x:{"+strconv.Itoa(shard(id))+"}:pool", id, v)
	}))
	out = append(out, measure("due zset only", func(p redis.Pipeliner, _ int, id string) {
		p.ZAdd(ctx, "x:{"+strconv.Itoa(shard(id))+"}:due", redis.Z{Score: score, Member: id})
	}))
	// A compact envelope: route fields (sink, destination, ingest) replaced
	// by a route number and the due time not repeated in the blob, ~8 bytes.
	vc := val(8)
	out = append(out, measure("compact envelope (8-byte header)", func(p redis.Pipeliner, _ int, id string) {
		s := strconv.Itoa(shard(id))
		p.HSet(ctx, "x:{"+s+"}:pool", id, vc)
		p.ZAdd(ctx, "x:{"+s+"}:due", redis.Z{Score: score, Member: id})
	}))
	// Pool split into small hashes (<= ~64 entries) kept as listpacks: no
	// dictEntry, no per-entry allocation. Needs hash-max-listpack-value >=
	// the encoded size (Redis config), so it suits small bodies only.
	if body+envBytes <= 4096 {
		old, _ := rdb.ConfigGet(ctx, "hash-max-listpack-value").Result()
		_ = rdb.ConfigSet(ctx, "hash-max-listpack-value", strconv.Itoa(body+envBytes+16)).Err()
		buckets := max(1, n/48) // ~48 entries per bucket on average (max well below 128)
		out = append(out, measure(fmt.Sprintf("pool in listpack buckets (%d hashes) + due zset", buckets), func(p redis.Pipeliner, i int, id string) {
			h := fnv.New32a()
			h.Write([]byte(id))
			b := int(h.Sum32() % uint32(buckets))
			s := strconv.Itoa(b % 16)
			p.HSet(ctx, "x:{"+s+"}:pool:"+strconv.Itoa(b), id, v)
			p.ZAdd(ctx, "x:{"+s+"}:due", redis.Z{Score: score, Member: id})
		}))
		for k, val := range old {
			_ = rdb.ConfigSet(ctx, k, val).Err()
		}
	}
	return out
}
