package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Micro-benchmarks of the Lua round trips the daemon makes per batch,
// against a real redis-server on loopback (testenv.Redis, AOF everysec as in
// production). One op is one batch of 256 messages; msg/s is reported too.
// Run: go test -run '^$' -bench . -benchmem ./pkg/store/

const benchBatch = 256

func benchStore(b *testing.B, shards int) *store.Store {
	b.Helper()
	r := testenv.Redis(b)
	return store.New(r.Client(), store.Options{Prefix: "bench", Shards: shards})
}

// benchMsgs returns n messages with IDs prefix-0000000.., a 100-byte body and
// the fields the NATS ingest fills in.
func benchMsgs(prefix string, n int, due time.Time) []*envelope.Message {
	now := time.Now().Truncate(time.Millisecond)
	body := make([]byte, 100)
	out := make([]*envelope.Message, n)
	for i := range out {
		out[i] = &envelope.Message{
			ID: fmt.Sprintf("%s-%07d", prefix, i), DueAt: due.Truncate(time.Millisecond),
			Sink: "out", Destination: "fired.default", Ingest: "in", IngestedAt: now, Body: body,
		}
	}
	return out
}

// redisStats returns, from INFO commandstats, the µs Redis spent in EVALSHA,
// EVAL and FCALL (the commands the scripts ran included) and how many other
// commands ran (most of them inside the scripts).
func redisStats(b *testing.B, rdb *redis.Client) (usec, calls float64) {
	stats, err := testenv.CommandStats(rdb)
	if err != nil {
		b.Fatal(err)
	}
	for name, c := range stats {
		switch name {
		case "evalsha", "eval", "fcall":
			usec += c.Usec
		case "info", "ping", "hello", "script|load", "function|load":
		default:
			calls += c.Calls
		}
	}
	return usec, calls
}

func reportMsgRate(b *testing.B) {
	b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "msg/s")
}

// BenchmarkPark parks batches of 256 (far-future due times, new IDs), spread
// over 16 shards as the ingest pipeline does (one script per shard, one
// pipeline), and into a single shard (one script call); window: 16 shards
// as the daemon runs them, the dedupe window on and each message read from
// a log (a JetStream stream), whose re-reads park looks for.
func BenchmarkPark(b *testing.B) {
	for _, c := range []struct {
		name   string
		shards int
		window time.Duration
	}{{"batch256-shards16", 16, 0}, {"batch256-shards1", 1, 0}, {"batch256-shards16-window", 16, time.Hour}} {
		b.Run(c.name, func(b *testing.B) {
			r := testenv.Redis(b)
			s := store.New(r.Client(), store.Options{Prefix: "bench", Shards: c.shards, DedupeWindow: c.window})
			ctx := context.Background()
			far := time.Now().Add(24 * time.Hour)
			usec0, calls0 := redisStats(b, r.Client())
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				msgs := benchMsgs(fmt.Sprintf("p%d", i), benchBatch, far)
				if c.window > 0 {
					for j, m := range msgs {
						m.Origin = envelope.Origin{Log: "DELAYED", Pos: uint64(i*benchBatch + j + 1)}
					}
				}
				b.StartTimer()
				if _, err := s.Park(ctx, msgs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportMsgRate(b)
			usec, calls := redisStats(b, r.Client())
			b.ReportMetric((usec-usec0)/float64(b.N*benchBatch), "redis-µs/msg")
			b.ReportMetric((calls-calls0)/float64(b.N*benchBatch), "commands/msg")
		})
	}
}

// BenchmarkClaim claims 256 due messages from one shard (the scheduler's
// default batch_size); with-dead: the shard also holds a dead message, so
// that its meta hash exists, as it does in a deployment with any failure.
func BenchmarkClaim(b *testing.B) {
	for _, dead := range []bool{false, true} {
		name := "batch256"
		if dead {
			name += "-with-dead"
		}
		b.Run(name, func(b *testing.B) {
			r := testenv.Redis(b)
			s := store.New(r.Client(), store.Options{Prefix: "bench", Shards: 1})
			ctx := context.Background()
			past := time.Now().Add(-time.Second)
			if dead {
				if _, err := s.Park(ctx, benchMsgs("dead", 1, past)); err != nil {
					b.Fatal(err)
				}
				c, err := s.Claim(ctx, 0, 1, time.Hour, nil)
				if err != nil || len(c.Messages) != 1 {
					b.Fatalf("claim: %v", err)
				}
				if n, err := s.MarkDead(ctx, c, []store.Failure{{ID: c.Messages[0].ID, Reason: "bench"}}); err != nil || n != 1 {
					b.Fatalf("dead: %d %v", n, err)
				}
			}
			var usec, calls float64
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if _, err := s.Park(ctx, benchMsgs(fmt.Sprintf("c%d", i), benchBatch, past)); err != nil {
					b.Fatal(err)
				}
				u0, c0 := redisStats(b, r.Client())
				b.StartTimer()
				c, err := s.Claim(ctx, 0, benchBatch, time.Hour, nil)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if len(c.Messages) != benchBatch {
					b.Fatalf("claimed %d, want %d", len(c.Messages), benchBatch)
				}
				u1, c1 := redisStats(b, r.Client())
				usec, calls = usec+u1-u0, calls+c1-c0
				b.StartTimer()
			}
			b.StopTimer()
			reportMsgRate(b)
			b.ReportMetric(usec/float64(b.N*benchBatch), "redis-µs/msg")
			b.ReportMetric(calls/float64(b.N*benchBatch), "commands/msg")
		})
	}
}

// BenchmarkAck acks the 256 messages of one claim.
func BenchmarkAck(b *testing.B) {
	s := benchStore(b, 1)
	ctx := context.Background()
	past := time.Now().Add(-time.Second)
	ids := make([]string, benchBatch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if _, err := s.Park(ctx, benchMsgs(fmt.Sprintf("a%d", i), benchBatch, past)); err != nil {
			b.Fatal(err)
		}
		c, err := s.Claim(ctx, 0, benchBatch, time.Hour, nil)
		if err != nil || len(c.Messages) != benchBatch {
			b.Fatalf("claim: %v (%d messages)", err, len(c.Messages))
		}
		for j, m := range c.Messages {
			ids[j] = m.ID
		}
		b.StartTimer()
		n, err := s.Ack(ctx, c, acks(ids...))
		if err != nil {
			b.Fatal(err)
		}
		if n != benchBatch {
			b.Fatalf("acked %d, want %d", n, benchBatch)
		}
	}
	reportMsgRate(b)
}

// BenchmarkReplace replaces one message among 10,000 parked (the
// x-delay-replace and kafka-scheduler path): one park script, a lookup by
// ID, no scan; its time does not grow with what is parked.
func BenchmarkReplace(b *testing.B) {
	s := benchStore(b, 16)
	ctx := context.Background()
	far := time.Now().Add(time.Hour)
	msgs := benchMsgs("r", 10_000, far)
	for i := 0; i < len(msgs); i += 1000 {
		if _, err := s.Park(ctx, msgs[i:i+1000]); err != nil {
			b.Fatal(err)
		}
	}
	pub := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m := *msgs[i%len(msgs)]
		m.Replace = true
		m.PublishedAt = pub.Add(time.Duration(i+1) * time.Millisecond)
		m.DueAt = far.Add(time.Duration(i) * time.Millisecond)
		res, err := s.Park(ctx, []*envelope.Message{&m})
		if err != nil || res[0] != store.Replaced {
			b.Fatalf("replace: %v %v", res, err)
		}
	}
}

// BenchmarkCancelGroup cancels a group of 10,000 among 100,000 parked over
// 16 shards (DELETE /v1/groups/{key}); one op is one whole cancel, the
// group parked again outside the timer. The target is under a second.
func BenchmarkCancelGroup(b *testing.B) {
	s := benchStore(b, 16)
	ctx := context.Background()
	msgs := benchMsgs("g", 100_000, time.Now().Add(time.Hour))
	var group []*envelope.Message
	for i, m := range msgs {
		m.Group = fmt.Sprintf("g-%d", i%997)
		if i%10 == 0 {
			m.Group = "big"
			group = append(group, m)
		}
	}
	for i := 0; i < len(msgs); i += 1000 {
		if _, err := s.Park(ctx, msgs[i:i+1000]); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i > 0 {
			b.StopTimer()
			for j := 0; j < len(group); j += 1000 {
				if _, err := s.Park(ctx, group[j:j+1000]); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
		if n, _, err := s.CancelGroup(ctx, "big"); err != nil || n != len(group) {
			b.Fatalf("cancel: %d %v", n, err)
		}
	}
}

// BenchmarkOneAtATime is the life of one message at a time, the shape of a
// low steady rate (each park, claim and settle carries one message): park
// it due, claim it, ack it with its dedupe mark and source. It reports, per
// message, Redis's own time (INFO commandstats: the scripts with the
// commands they run), which this shared machine makes noisy, and the
// commands the scripts ran, which it does not: the figure a script's change
// moves. The wall time per op adds the three round trips. It runs the hot
// path as Redis functions and as scripts (Options.NoFunctions), back to
// back and, "paced", a millisecond apart, as at 1k msg/s (Redis idle
// between calls, its caches cold).
func BenchmarkOneAtATime(b *testing.B) {
	for _, paced := range []bool{false, true} {
		for _, scripts := range []bool{false, true} {
			name := map[bool]string{false: "functions", true: "scripts"}[scripts]
			if paced {
				name += "/paced"
			}
			b.Run(name, func(b *testing.B) { oneAtATime(b, scripts, paced) })
		}
	}
}

func oneAtATime(b *testing.B, scripts, paced bool) {
	r := testenv.Redis(b)
	// as the daemon runs it: 16 shards, the dedupe window on
	s := store.New(r.Client(), store.Options{Prefix: "bench", Shards: 16, MaxDead: 1000, DedupeWindow: time.Hour, NoFunctions: scripts})
	ctx := context.Background()
	past := time.Now().Add(-time.Second)
	one := func(i int) {
		m := benchMsgs(fmt.Sprintf("o%d", i), 1, past)[0]
		m.Origin = envelope.Origin{Log: "in/0", Pos: uint64(i)}
		if _, err := s.Park(ctx, []*envelope.Message{m}); err != nil {
			b.Fatal(err)
		}
		c, err := s.Claim(ctx, s.ShardOf(m.ID), benchBatch, time.Minute, nil)
		if err != nil || len(c.Messages) != 1 {
			b.Fatalf("claim: %v (%d messages)", err, len(c.Messages))
		}
		if n, err := s.Ack(ctx, c, []store.Done{{ID: m.ID, Origin: m.Origin, Source: m.Ingest}}); err != nil || n != 1 {
			b.Fatalf("ack: %v (%d acked)", err, n)
		}
	}
	for i := range 16 { // each shard's scripts loaded, its layout marked
		one(-1 - i)
	}
	usec0, calls0 := redisStats(b, r.Client())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		one(i)
		if paced {
			time.Sleep(time.Millisecond)
		}
	}
	b.StopTimer()
	usec, calls := redisStats(b, r.Client())
	b.ReportMetric((usec-usec0)/float64(b.N), "redis-µs/msg")
	b.ReportMetric((calls-calls0)/float64(b.N), "commands/msg")
}
