package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

var (
	flagDedupeN     = flag.Int("dedupe-n", 5000, "messages delivered per run of TestDedupeWindowMemory; 120000 is what a 2m window holds at 1k msg/s")
	flagDedupeIDLen = flag.Int("dedupe-idlen", 36, "length of the IDs of TestDedupeWindowMemory (36: a UUID)")
)

// TestDedupeWindowMemory measures the Redis memory scheduler.dedupe_window
// costs per remembered ID, through the real binary and real acks: n
// messages with 36-character IDs (UUIDs) are delivered once with the window
// off and once with the default 2m, each into a fresh Redis without
// persistence, and INFO used_memory is read before and after (after a
// warm-up that loads the scripts and creates the sinks' state). With the
// window off Redis is empty again when everything is delivered; with it on,
// it holds each delivered ID (and where it was read) as a field of its
// shard's bucket of the window (<prefix>:{N}:seen:<B>), a few hashes per
// shard that expire whole. docs/operations.md gives the
// figure of
//
//	go test -count=1 -run TestDedupeWindowMemory -v ./test/e2e/ -args -dedupe-n 120000
func TestDedupeWindowMemory(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	n := *flagDedupeN
	const warm = 200
	var delta [2]float64
	for i, window := range []time.Duration{0, 2 * time.Minute} {
		rs := testenv.Redis(t, testenv.WithArgs("--appendonly", "no"))
		rdb := rs.Client()
		ns := testenv.NATS(t)
		nc, err := nats.Connect(ns.URL)
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DELAYED", Subjects: []string{"delayed.>"}}); err != nil {
			t.Fatal(err)
		}
		// A core NATS sink: nothing to confirm but the flush; the figure is
		// Redis's, which the sink kind does not change.
		d := startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: delaybridge}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, dedupe_window: %s}
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    max_in_flight: 4000
    route: {sink: out, destination: fired.mem}
sinks:
  - name: out
    nats: {url: "%s", jetstream: false}
`, rs.Addr, window, ns.URL, ns.URL))
		publish := func(from, to int) {
			for j := from; j < to; j++ {
				m := nats.NewMsg("delayed.mem")
				m.Header.Set(envelope.HeaderDelay, "0")
				m.Header.Set(envelope.HeaderMessageID, memID(uint64(i)<<32|uint64(j)))
				if _, err := js.PublishMsgAsync(m); err != nil {
					t.Fatal(err)
				}
				if (j-from)%2000 == 1999 || j == to-1 { // at most 2,000 unconfirmed
					select {
					case <-js.PublishAsyncComplete():
					case <-time.After(time.Minute):
						t.Fatal("ingest publishes not confirmed")
					}
				}
			}
		}
		delivered := func(want int) {
			testenv.Eventually(t, 5*time.Minute, func() bool {
				v, _ := metricValue(d.metrics(), "delaybridge_sink_published_total", nil)
				return int(v) >= want && d.stats().Parked == 0
			}, "%d messages not delivered", want)
		}
		publish(0, warm)
		delivered(warm)
		_ = rdb.Do(ctx, "MEMORY", "PURGE").Err()
		before := usedMemory(t, rdb)
		keys0 := rdb.DBSize(ctx).Val()
		start := time.Now()
		publish(warm, warm+n)
		delivered(warm + n)
		took := time.Since(start)
		_ = rdb.Do(ctx, "MEMORY", "PURGE").Err()
		after := usedMemory(t, rdb)
		keys1 := rdb.DBSize(ctx).Val()
		delta[i] = after - before
		t.Logf("dedupe_window %v: %d messages delivered in %v; used_memory %.0f -> %.0f bytes (%+.1f per message), keys %d -> %d",
			window, n, took.Round(time.Millisecond), before, after, delta[i]/float64(n), keys0, keys1)
		if window == 0 {
			if keys1 != keys0 {
				t.Errorf("window off: %d keys after delivery, %d before: something is remembered", keys1, keys0)
			}
			continue
		}
		if extra := keys1 - keys0; extra > 3*16 {
			t.Errorf("window %v: %d more keys after %d deliveries, want at most three buckets per shard, not a key per ID", window, extra, n)
		}
		id := memID(uint64(i)<<32 | uint64(warm))
		buckets, _ := rdb.Keys(ctx, fmt.Sprintf("delaybridge:{%d}:seen:*", shardOfID(id))).Result()
		var key string
		for _, b := range buckets {
			if rdb.HExists(ctx, b, store.SeenField(id, "DELAYED")).Val() {
				key = b
			}
		}
		ttl, err := rdb.PTTL(ctx, key).Result()
		if key == "" || err != nil || ttl <= 0 || ttl > 3*window {
			t.Errorf("%s is remembered in %q with a TTL of %v (%v), want within three windows (%v)", id, key, ttl, err, 3*window)
		}
		usage, _ := rdb.MemoryUsage(ctx, key, 0).Result()
		usage /= max(1, rdb.HLen(ctx, key).Val())
		perID := (delta[1] - delta[0]) / float64(n)
		mib := func(ids float64) float64 { return ids * perID / (1 << 20) }
		t.Logf("one remembered ID (%d-character ID, prefix %q): MEMORY USAGE of its bucket per field %d bytes; used_memory per remembered ID %.0f bytes "+
			"(window on minus off, over %d IDs, dict buckets and expiry entries included); "+
			"a 2m window holds rate x 120 s IDs: %.1f MiB at 1k msg/s (120,000 IDs), %.0f MiB at 10k msg/s (1.2 M IDs)",
			*flagDedupeIDLen, "delaybridge", usage, perID, n, mib(120_000), mib(1_200_000))
	}
}

// memID is an ID of -dedupe-idlen characters: a UUID, padded with its own
// characters or cut.
func memID(seed uint64) string {
	id := uuid(seed)
	for len(id) < *flagDedupeIDLen {
		id += uuid(seed + uint64(len(id)))
	}
	return id[:*flagDedupeIDLen]
}

// uuid is a UUID-shaped ID (36 characters) drawn from seed.
func uuid(seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 14))
	return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xfff, 0x8000|r.Uint32()&0x3fff, r.Uint64()&0xffffffffffff)
}

// shardOfID is docs/store.md's FNV-1a (32 bit) of the ID modulo 16 shards.
func shardOfID(id string) int {
	var h uint32 = 2166136261
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return int(h % 16)
}

// usedMemory is INFO memory's used_memory.
func usedMemory(t *testing.T, rdb *redis.Client) float64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no used_memory in INFO memory")
	return 0
}
