package store_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// readable is one piece of what Redis holds, read as a client would: a
// key's name, or a value, field, member or element of it.
type readable struct{ key, what, text string }

// readEverything reads every key of the Redis (SCAN) and every part of its
// value, by type.
func readEverything(t *testing.T, rdb redis.UniversalClient) []readable {
	t.Helper()
	ctx := context.Background()
	var out []readable
	add := func(key, what string, texts ...string) {
		for _, s := range texts {
			out = append(out, readable{key, what, s})
		}
	}
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		add(k, "key name", k)
		typ, err := rdb.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case "string":
			add(k, "value", rdb.Get(ctx, k).Val())
		case "hash":
			for f, v := range rdb.HGetAll(ctx, k).Val() {
				add(k, "field", f)
				add(k, "value of "+f, v)
			}
		case "zset":
			for _, z := range rdb.ZRangeWithScores(ctx, k, 0, -1).Val() {
				add(k, "member", fmt.Sprint(z.Member))
			}
		case "set":
			add(k, "member", rdb.SMembers(ctx, k).Val()...)
		case "list":
			add(k, "element", rdb.LRange(ctx, k, 0, -1).Val()...)
		default:
			t.Fatalf("key %s is a %s, which this test does not read: read it", k, typ)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// With encryption on, Redis holds nothing of what a message carries but
// what docs/security.md ("Encryption at rest") lists as readable: a
// message of every kind is parked through envelope.Parse (plain,
// grouped, recurring by cron in a zone, recurring every interval with an
// end and a count, to a destination template, replaced while in flight,
// dead with a reason, retried with an error, rejected at ingest, held for
// its sink, in flight, delivered and remembered by the dedupe window), and
// every key of the Redis is read: no body, header value, Kafka key, group
// name, cron, zone, interval, dead reason or last error appears, and what
// the page lists as readable does (IDs, names, the destination a template
// expanded a header into).
func TestEncryptionAtRestShowsOnlyWhatSecurityMdLists(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "atrest", Shards: 4, MaxDead: 100, DedupeWindow: time.Hour,
		Sealer: keyringOf(t, "k1", "k1")})
	now := time.Now().Truncate(time.Millisecond)
	route := &envelope.Route{Ingest: "orders-in", Sink: "nats-out", Destination: "fired.orders", AllowOverride: true, AllowedSinks: []string{"nats-out", "blocked"}}
	templated := &envelope.Route{Ingest: "orders-in", Sink: "nats-out", Destination: "fired.{header.x-tenant}", AllowedDestinations: []string{"fired.*"}}
	// A week: the cron below (weekdays) is up to three days away on a weekend.
	lim := envelope.Limits{MaxDelay: 7 * 24 * time.Hour}
	// in is an ingested message with a secret body, key and header of its
	// own (HIDDEN-<id>), and the headers kv.
	in := func(id string, kv ...string) *envelope.Incoming {
		m := &envelope.Incoming{Body: []byte("HIDDEN-BODY-" + id), Key: []byte("HIDDEN-KEY-" + id), PublishedAt: now.Add(-2 * time.Second),
			Headers: envelope.Headers{{Key: "x-message-id", Value: id}, {Key: "authorization", Value: "Bearer HIDDEN-HEADER-" + id}}}
		for i := 0; i+1 < len(kv); i += 2 {
			m.Headers = append(m.Headers, envelope.Header{Key: kv[i], Value: kv[i+1]})
		}
		return m
	}
	parse := func(r *envelope.Route, m *envelope.Incoming, want envelope.Action) envelope.Decision {
		t.Helper()
		d := envelope.Parse(m, r, lim, now, nil)
		if d.Action != want {
			t.Fatalf("%v: %s %v, want %s", m.Headers, d.Action, d.Err, want)
		}
		return d
	}
	later, due := "3600000", envelope.FormatTime(now.Add(-time.Second))
	kafka := in("deduped", "x-deliver-at", due)
	kafka.Origin = envelope.Origin{Log: "orders-topic/0", Pos: 7}
	var msgs []*envelope.Message
	for _, d := range []envelope.Decision{
		parse(route, in("plain", "x-delay", later), envelope.Park),
		parse(route, in("grouped", "x-delay", later, "x-delay-group", "HIDDEN-GROUP-cart-7"), envelope.Park),
		parse(route, in("cron", "x-delay-cron", "17 9 * * 1-5", "x-delay-timezone", "Pacific/Chatham", "x-delay-group", "HIDDEN-GROUP-crons"), envelope.Park),
		parse(route, in("every", "x-delay-every", "1h23m45s", "x-delay-until", "2031-02-03T04:05:06Z", "x-delay-count", "77"), envelope.Park),
		parse(templated, in("templated", "x-delay", later, "x-tenant", "TENANTX"), envelope.Park),
		parse(route, in("replaced", "x-deliver-at", due), envelope.Park),
		parse(route, in("dead", "x-deliver-at", due), envelope.Park),
		parse(route, in("retried", "x-deliver-at", due), envelope.Park),
		parse(route, in("held", "x-deliver-at", due, "x-delay-sink", "blocked"), envelope.Park),
		parse(route, in("inflight", "x-deliver-at", due), envelope.Park),
		parse(route, kafka, envelope.Park),
	} {
		msgs = append(msgs, d.Message)
	}
	park(t, s, store.Parked, msgs...)
	leases := map[string]*store.Lease{}
	for sh := 0; sh < s.Shards(); sh++ {
		l, err := s.Claim(ctx, sh, 100, time.Hour, map[string]int{"blocked": 0})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range l.Messages {
			leases[c.ID] = l
		}
	}
	if len(leases) != 5 {
		t.Fatalf("claimed %v, want the five due ones (held is held)", leases)
	}
	if n, err := s.MarkDead(ctx, leases["dead"], []store.Failure{{ID: "dead", Reason: "nats: permissions violation for HIDDEN-REASON-dead"}}); err != nil || n != 1 {
		t.Fatalf("dead: %d %v", n, err)
	}
	if n, err := s.Retry(ctx, leases["retried"], []store.RetryAt{{ID: "retried", At: now.Add(time.Hour), Reason: "timeout for HIDDEN-REASON-retried"}}); err != nil || n != 1 {
		t.Fatalf("retry: %d %v", n, err)
	}
	if n, err := s.Ack(ctx, leases["deduped"], []store.Done{{ID: "deduped", Origin: kafka.Origin}}); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	park(t, s, store.Duplicate, parse(route, kafka, envelope.Park).Message) // the re-read
	v2 := in("replaced", "x-delay", later, "x-delay-replace", "true", "x-delay-group", "HIDDEN-GROUP-v2")
	v2.PublishedAt = now.Add(-time.Second)
	park(t, s, store.Queued, parse(route, v2, envelope.Park).Message)
	rej := parse(route, in("rejected", "x-delay-cron", "HIDDEN-CRON * *", "x-delay-group", "HIDDEN-GROUP-rejected"), envelope.Reject)
	if !strings.Contains(rej.Err.Error(), "HIDDEN-CRON") {
		t.Fatalf("the reason does not quote the cron: %v", rej.Err)
	}
	if _, err := s.Reject(ctx, []store.Rejected{{Message: rej.Message, Reason: rej.Err.Error()}}); err != nil {
		t.Fatal(err)
	}

	// What Redis shows.
	everything := readEverything(t, rdb)
	var failures []string
	for _, r := range everything {
		for _, secret := range []string{"HIDDEN", "authorization", "17 9 * * 1-5", "Pacific/Chatham", "Chatham", "1h23m45s", "5025000",
			"2031-02-03", "x-delay", "is not a 5- or 6-field", "permissions violation", "timeout for"} {
			if strings.Contains(r.text, secret) {
				failures = append(failures, fmt.Sprintf("%s %s holds %q: %q", r.key, r.what, secret, r.text))
			}
		}
	}
	sort.Strings(failures)
	for _, f := range failures {
		t.Error(f)
	}
	// What docs/security.md lists as readable is.
	for _, want := range []string{"plain", "cron", "deduped", "nats-out", "blocked", "fired.orders", "orders-in", "orders-topic/0", "k1",
		"fired.TENANTX"} {
		found := false
		for _, r := range everything {
			found = found || strings.Contains(r.text, want)
		}
		if !found {
			t.Errorf("%q, which docs/security.md lists as readable, is nowhere in Redis: correct the page", want)
		}
	}
	// The template copied the header into the destination, the one place
	// it is readable (docs/security.md says so).
	for _, r := range everything {
		if strings.Contains(r.text, "TENANTX") && (r.key != s.Keys().Pool(s.ShardOf("templated")) || r.what != "value of templated") {
			t.Errorf("the templated header's value is readable in %s %s", r.key, r.what)
		}
	}

	// And everything opens with the key.
	for id, want := range map[string]string{"grouped": "HIDDEN-GROUP-cart-7", "cron": "Pacific/Chatham", "dead": "HIDDEN-REASON-dead",
		"retried": "HIDDEN-REASON-retried", "rejected": "HIDDEN-CRON"} {
		info, err := s.Inspect(ctx, id)
		if err != nil || info.Err != nil {
			t.Fatalf("%s: %v %+v", id, err, info)
		}
		if got := fmt.Sprint(info.Message.Group, " ", info.Message.Recur, " ", info.Reason); !strings.Contains(got, want) {
			t.Errorf("%s opens to %q, want %q in it", id, got, want)
		}
	}
	if ids, err := s.GroupMembers(ctx, "HIDDEN-GROUP-cart-7", 0); err != nil || len(ids) != 1 || ids[0] != "grouped" {
		t.Errorf("group HIDDEN-GROUP-cart-7: %v %v", ids, err)
	}
}
