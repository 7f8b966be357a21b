package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

func newStore(t *testing.T, shards int) *store.Store {
	t.Helper()
	r := testenv.Redis(t)
	return store.New(r.Client(), store.Options{Prefix: "t", Shards: shards, MaxDead: 1000})
}

func msg(id string, due time.Time) *envelope.Message {
	return &envelope.Message{
		ID: id, DueAt: due.Truncate(time.Millisecond), Sink: "s", Destination: "d",
		Headers: envelope.Headers{{Key: "k", Value: "v"}}, Body: []byte("body-" + id),
	}
}

func claimAll(t *testing.T, s *store.Store, lease time.Duration) map[string]store.Claimed {
	t.Helper()
	got := map[string]store.Claimed{}
	for sh := 0; sh < s.Shards(); sh++ {
		c, err := s.Claim(context.Background(), sh, 1000, lease, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range c.Messages {
			got[m.ID] = m
		}
	}
	return got
}

func TestParkIsIdempotentAndClaimTakesOnlyDue(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	now := time.Now()
	msgs := []*envelope.Message{
		msg("past", now.Add(-time.Second)),
		msg("now", now),
		msg("later", now.Add(time.Hour)),
	}
	parked, err := s.Park(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range parked {
		if p != store.Parked {
			t.Fatalf("message %d: %v, want parked", i, p)
		}
	}
	// Parking the same IDs again changes nothing, even with another body.
	again := msg("past", now.Add(time.Hour))
	again.Body = []byte("other")
	parked, err = s.Park(ctx, []*envelope.Message{again})
	if err != nil || parked[0] != store.Known {
		t.Fatalf("second park = %v, %v; want known, nil", parked, err)
	}

	got := claimAll(t, s, time.Minute)
	if len(got) != 2 || got["past"].Message == nil || got["now"].Message == nil {
		t.Fatalf("claimed %v, want past and now", keys(got))
	}
	m := got["past"]
	if string(m.Message.Body) != "body-past" || m.Attempt != 1 || !m.Message.DueAt.Equal(msgs[0].DueAt) {
		t.Fatalf("claimed %+v (body %q)", m, m.Message.Body)
	}
	if v, _ := m.Message.Headers.Get("k"); v != "v" {
		t.Fatalf("headers %v", m.Message.Headers)
	}
	// In flight: not claimable again until the lease expires.
	if again := claimAll(t, s, time.Minute); len(again) != 0 {
		t.Fatalf("claimed again while leased: %v", keys(again))
	}
	info, err := s.Inspect(ctx, "past")
	if err != nil || info.State != store.StateInflight || info.Attempts != 1 {
		t.Fatalf("inspect = %+v, %v; want inflight, 1 attempt", info, err)
	}
	info, err = s.Inspect(ctx, "later")
	if err != nil || info.State != store.StateScheduled || info.Attempts != 0 || info.Message.Destination != "d" {
		t.Fatalf("inspect later = %+v, %v", info, err)
	}
}

func TestClaimReportsNextDueAndServerTime(t *testing.T) {
	s := newStore(t, 1)
	now := time.Now()
	if _, err := s.Park(context.Background(), []*envelope.Message{msg("a", now.Add(time.Hour)), msg("b", now.Add(2*time.Hour))}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(context.Background(), 0, 10, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Messages) != 0 {
		t.Fatalf("claimed %d", len(c.Messages))
	}
	if want := now.Add(time.Hour).Truncate(time.Millisecond); !c.Next.Equal(want) {
		t.Fatalf("next = %v, want %v", c.Next, want)
	}
	if d := c.Now.Sub(now); d < -5*time.Second || d > 5*time.Second {
		t.Fatalf("server time %v is far from local %v", c.Now, now)
	}
	empty := newStore(t, 1)
	c, err = empty.Claim(context.Background(), 0, 10, time.Minute, nil)
	if err != nil || !c.Next.IsZero() {
		t.Fatalf("empty shard: next = %v, err %v", c.Next, err)
	}
}

func TestClaimBatchLimit(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	var msgs []*envelope.Message
	base := time.Now().Add(-time.Minute)
	for i := 0; i < 25; i++ {
		msgs = append(msgs, msg(fmt.Sprintf("m%02d", i), base.Add(time.Duration(i)*time.Millisecond)))
	}
	if _, err := s.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Messages) != 10 {
		t.Fatalf("claimed %d, want 10", len(c.Messages))
	}
	for i, m := range c.Messages { // due order
		if want := fmt.Sprintf("m%02d", i); m.ID != want {
			t.Fatalf("claim[%d] = %s, want %s", i, m.ID, want)
		}
	}
	if !c.Next.Before(c.Now) {
		t.Fatalf("next %v should be due (before %v): more are waiting", c.Next, c.Now)
	}
}

func TestAckRetryDeadHonourTheToken(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	now := time.Now().Add(-time.Second)
	if _, err := s.Park(ctx, []*envelope.Message{msg("ok", now), msg("again", now), msg("bad", now)}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 3 {
		t.Fatalf("claim: %v, %v", c, err)
	}
	// A stale token changes nothing.
	if n, err := s.Ack(ctx, &store.Lease{Shard: 0, ExpiryMs: c.ExpiryMs - 1}, acks("ok")); err != nil || n != 0 {
		t.Fatalf("stale ack = %d, %v", n, err)
	}
	if n, err := s.Ack(ctx, c, acks("ok")); err != nil || n != 1 {
		t.Fatalf("ack = %d, %v", n, err)
	}
	if _, err := s.Inspect(ctx, "ok"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("acked message still there: %v", err)
	}
	next := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if n, err := s.Retry(ctx, c, []store.RetryAt{{ID: "again", At: next, Reason: "broker down"}}); err != nil || n != 1 {
		t.Fatalf("retry = %d, %v", n, err)
	}
	info, err := s.Inspect(ctx, "again")
	if err != nil || info.State != store.StateScheduled || !info.NextAt.Equal(next) || info.Attempts != 1 || info.Reason != "broker down" {
		t.Fatalf("after retry: %+v, %v", info, err)
	}
	if n, err := s.MarkDead(ctx, c, []store.Failure{{ID: "bad", Reason: "unroutable | really"}}); err != nil || n != 1 {
		t.Fatalf("dead = %d, %v", n, err)
	}
	info, err = s.Inspect(ctx, "bad")
	if err != nil || info.State != store.StateDead || info.Reason != "unroutable | really" || info.DeadAt.IsZero() {
		t.Fatalf("after dead: %+v, %v", info, err)
	}
	// The retried message keeps counting attempts.
	if err := s.RetryDead(ctx, "again"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RetryDead of a scheduled message: %v", err)
	}
}

func TestExpiredLeaseIsClaimedAgain(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	if _, err := s.Park(ctx, []*envelope.Message{msg("a", time.Now().Add(-time.Second))}); err != nil {
		t.Fatal(err)
	}
	first, err := s.Claim(ctx, 0, 10, 20*time.Millisecond, nil)
	if err != nil || len(first.Messages) != 1 {
		t.Fatalf("first claim: %v %v", first, err)
	}
	var second *store.Lease
	testenv.Eventually(t, 5*time.Second, func() bool {
		second, err = s.Claim(ctx, 0, 10, time.Minute, nil)
		return err == nil && len(second.Messages) == 1
	}, "message not claimed again after its lease expired")
	if second.Messages[0].Attempt != 2 {
		t.Fatalf("attempt = %d, want 2", second.Messages[0].Attempt)
	}
	// The first claimer lost the message: its ack does nothing.
	if n, _ := s.Ack(ctx, first, acks("a")); n != 0 {
		t.Fatalf("stale claimer acked %d", n)
	}
	if n, _ := s.Ack(ctx, second, acks("a")); n != 1 {
		t.Fatalf("owner acked %d", n)
	}
}

// A claim takes what is due in score order, whatever state it is due
// from: a lease that ended before a parked message's due time is taken
// first (in layout 2 the two are in different sets, merged by the claim).
func TestClaimTakesWhatIsDueInOrder(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	if _, err := s.Park(ctx, []*envelope.Message{msg("a", time.Now().Add(-time.Second))}); err != nil {
		t.Fatal(err)
	}
	first, err := s.Claim(ctx, 0, 10, 100*time.Millisecond, nil)
	if err != nil || len(first.Messages) != 1 {
		t.Fatalf("first claim: %v %v", first, err)
	}
	// b falls due 50 ms after a's lease ends
	if _, err := s.Park(ctx, []*envelope.Message{msg("b", first.Expiry().Add(50*time.Millisecond))}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		now, err := s.Client().Time(ctx).Result()
		return err == nil && now.After(first.Expiry().Add(100*time.Millisecond))
	}, "Redis's clock did not pass b's due time")
	var order []string
	for range 2 {
		c, err := s.Claim(ctx, 0, 1, time.Minute, nil)
		if err != nil || len(c.Messages) != 1 {
			t.Fatalf("claim: %v %v", c, err)
		}
		order = append(order, fmt.Sprintf("%s@%d", c.Messages[0].ID, c.Messages[0].Attempt))
	}
	if want := []string{"a@2", "b@1"}; !slices.Equal(order, want) {
		t.Fatalf("claimed %v, want %v: the ended lease first, its abandoned attempt counted", order, want)
	}
}

func TestCancel(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	if _, err := s.Park(ctx, []*envelope.Message{msg("c", time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, "c"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second cancel: %v", err)
	}
	if _, err := s.Inspect(ctx, "c"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("inspect after cancel: %v", err)
	}
	if got := claimAll(t, s, time.Minute); len(got) != 0 {
		t.Fatalf("cancelled message claimed: %v", keys(got))
	}
}

func TestRejectKeepsDeadAndNeverOverwrites(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	good := msg("same", time.Now().Add(time.Hour))
	if _, err := s.Park(ctx, []*envelope.Message{good}); err != nil {
		t.Fatal(err)
	}
	bad := msg("same", time.Now())
	bad.Body = []byte("bad body")
	other := msg("fresh", time.Now())
	ids, err := s.Reject(ctx, []store.Rejected{{Message: bad, Reason: "x-delay is empty"}, {Message: other, Reason: "no delay"}})
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] == "same" || ids[0] == "" || ids[1] != "fresh" {
		t.Fatalf("ids = %v", ids)
	}
	info, err := s.Inspect(ctx, "same")
	if err != nil || info.State != store.StateScheduled || string(info.Message.Body) != "body-same" {
		t.Fatalf("the parked message was changed: %+v %v", info, err)
	}
	info, err = s.Inspect(ctx, ids[0])
	if err != nil || info.State != store.StateDead || string(info.Message.Body) != "bad body" ||
		!strings.Contains(info.Reason, "x-delay is empty") || !strings.Contains(info.Reason, `"same"`) {
		t.Fatalf("dead copy: %+v %v", info, err)
	}
	dead, err := s.ListDead(ctx, 10)
	if err != nil || len(dead) != 2 {
		t.Fatalf("list dead = %d, %v", len(dead), err)
	}
	// Retry schedules it due now; it is then claimable.
	if err := s.RetryDead(ctx, "fresh"); err != nil {
		t.Fatal(err)
	}
	info, err = s.Inspect(ctx, "fresh")
	if err != nil || info.State != store.StateScheduled {
		t.Fatalf("after retry: %+v %v", info, err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { _, ok := claimAll(t, s, time.Minute)["fresh"]; return ok })
	n, err := s.PurgeDead(ctx)
	if err != nil || n != 1 {
		t.Fatalf("purge = %d, %v", n, err)
	}
}

func TestDeadRetentionCap(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, MaxDead: 5})
	for i := 0; i < 8; i++ {
		if _, err := s.Reject(ctx, []store.Rejected{{Message: msg(fmt.Sprintf("d%d", i), time.Now()), Reason: "r"}}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Dead != 5 {
		t.Fatalf("dead = %d, %v; want 5", st.Dead, err)
	}
	if n, _ := r.Client().HLen(ctx, s.Keys().Pool(0)).Result(); n != 5 {
		t.Fatalf("pool holds %d, want 5: trimmed dead messages must leave the pool", n)
	}
}

// TestStats counts on one Redis and on a Cluster, where each shard's
// script reads the clock of its own node.
func TestStats(t *testing.T) {
	onSingleAndCluster(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := store.New(rdb, store.Options{Prefix: "t", Shards: 4, MaxDead: 1000})
		now := time.Now()
		var msgs []*envelope.Message
		for i := 0; i < 10; i++ {
			due := now.Add(time.Hour)
			if i < 3 {
				due = now.Add(-time.Minute)
			}
			msgs = append(msgs, msg(fmt.Sprintf("s%d", i), due))
		}
		if _, err := s.Park(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Parked != 10 || st.Due != 3 || st.Dead != 0 || len(st.Shards) != 4 {
			t.Fatalf("stats = %+v", st)
		}
		var sum int64
		for _, sh := range st.Shards {
			sum += sh.Parked
		}
		if sum != 10 {
			t.Fatalf("per-shard parked sums to %d", sum)
		}
		if st.OldestDue.IsZero() || st.OldestDue.After(now) {
			t.Fatalf("oldest due %v", st.OldestDue)
		}
	})
}

// Node names the node that holds a shard's keys: its own keys answer
// there, not with a MOVED; "" on one Redis.
func TestNodeHoldsTheShard(t *testing.T) {
	onSingleAndCluster(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := store.New(rdb, store.Options{Prefix: "t", Shards: 4, MaxDead: 1000})
		_, cluster := rdb.(*redis.ClusterClient)
		nodes := map[string]bool{}
		for i := range 40 {
			id := fmt.Sprintf("n%d", i)
			if _, err := s.Park(ctx, []*envelope.Message{msg(id, time.Now().Add(time.Hour))}); err != nil {
				t.Fatal(err)
			}
			shard := s.ShardOf(id)
			node := s.Node(ctx, shard)
			if !cluster {
				if node != "" {
					t.Fatalf("Node(%d) = %q on one Redis, want \"\"", shard, node)
				}
				continue
			}
			nodes[node] = true
			c := redis.NewClient(&redis.Options{Addr: node})
			n, err := c.HExists(ctx, s.Keys().Pool(shard), id).Result()
			_ = c.Close()
			if err != nil || !n {
				t.Fatalf("shard %d's pool on Node(%d) = %q: %v, %v", shard, shard, node, n, err)
			}
		}
		if cluster && len(nodes) < 2 {
			t.Fatalf("4 shards on a 3-node cluster landed on %d node(s): %v", len(nodes), nodes)
		}
	})
}

// TestStatsDueIn checks the due-time buckets: each parked message counts in
// exactly one, dead messages in none.
func TestStatsDueIn(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	now := time.Now()
	offsets := map[time.Duration]int{-time.Hour: 2, -time.Second: 1, 20 * time.Second: 3, 30 * time.Minute: 4, 5 * time.Hour: 5, 72 * time.Hour: 6}
	var msgs []*envelope.Message
	for off, n := range offsets {
		for i := 0; i < n; i++ {
			msgs = append(msgs, msg(fmt.Sprintf("%v-%d", off, i), now.Add(off)))
		}
	}
	if _, err := s.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reject(ctx, []store.Rejected{{Message: msg("dead", now), Reason: "r"}}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := store.DueIn{Overdue: 3, Minute: 3, Hour: 4, Day: 5, Later: 6}
	if st.DueIn != want || st.Due != want.Overdue || st.Parked != 21 {
		t.Fatalf("due in %+v (due %d, parked %d), want %+v (due 3, parked 21)", st.DueIn, st.Due, st.Parked, want)
	}
}

func TestCheckShardsRefusesAnotherCount(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	if err := store.New(r.Client(), store.Options{Prefix: "p", Shards: 16}).CheckShards(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.New(r.Client(), store.Options{Prefix: "p", Shards: 16}).CheckShards(ctx); err != nil {
		t.Fatal(err)
	}
	err := store.New(r.Client(), store.Options{Prefix: "p", Shards: 8}).CheckShards(ctx)
	if !errors.Is(err, store.ErrShardMismatch) || !strings.Contains(err.Error(), "16") {
		t.Fatalf("err = %v", err)
	}
	if err := store.New(r.Client(), store.Options{Prefix: "other", Shards: 8}).CheckShards(ctx); err != nil {
		t.Fatalf("another prefix: %v", err)
	}
}

func TestScriptsSurviveScriptFlush(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 4})
	if _, err := s.Park(ctx, []*envelope.Message{msg("a", time.Now())}); err != nil {
		t.Fatal(err)
	}
	if err := r.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// A pipelined park over several shards hits NOSCRIPT and must recover.
	var msgs []*envelope.Message
	for i := 0; i < 20; i++ {
		msgs = append(msgs, msg(fmt.Sprintf("b%d", i), time.Now()))
	}
	parked, err := s.Park(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range parked {
		if p != store.Parked {
			t.Fatalf("message %d not parked after SCRIPT FLUSH: %v", i, p)
		}
	}
}

func TestKeysShareHashTagPerShard(t *testing.T) {
	k := store.NewKeys("delaybridge")
	for sh := 0; sh < 16; sh++ {
		tag := fmt.Sprintf("{%d}", sh)
		for _, key := range []string{k.Pool(sh), k.Due(sh), k.Meta(sh), k.Dead(sh)} {
			if !strings.HasPrefix(key, "delaybridge:"+tag+":") {
				t.Fatalf("key %q lacks hash tag %s", key, tag)
			}
		}
	}
	// The shard of an ID is stable (documented as FNV-1a 32 modulo shards).
	if got := store.ShardOf("order-42", 16); got != store.ShardOf("order-42", 16) || got < 0 || got > 15 {
		t.Fatal("unstable shard")
	}
	if got, want := store.ShardOf("a", 16), int(0xe40c292c%16); got != want {
		t.Fatalf("ShardOf(a) = %d, want %d (FNV-1a)", got, want)
	}
}

func keys(m map[string]store.Claimed) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// With a backlog, higher x-delay-priority is claimed first, due order within
// a priority; every operation finds a message in its priority's due set.
func TestPriorityOrdersTheBacklog(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	base := time.Now().Add(-time.Minute)
	var msgs []*envelope.Message
	for i := 0; i < 30; i++ {
		m := msg(fmt.Sprintf("m%02d", i), base.Add(time.Duration(i)*time.Millisecond))
		m.Priority = uint8(i % 3 * 4) // 0, 4, 8
		msgs = append(msgs, m)
	}
	if _, err := s.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Parked != 30 || st.Due != 30 {
		t.Fatalf("stats %+v %v", st, err)
	}
	c, err := s.Claim(ctx, 0, 15, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range c.Messages {
		got = append(got, fmt.Sprintf("%s/p%d", m.ID, m.Message.Priority))
	}
	want := []string{"m02/p8", "m05/p8", "m08/p8", "m11/p8", "m14/p8", "m17/p8", "m20/p8", "m23/p8", "m26/p8", "m29/p8",
		"m01/p4", "m04/p4", "m07/p4", "m10/p4", "m13/p4"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("claim order\n got %v\nwant %v", got, want)
	}
	// Every operation finds the message in its own due set.
	if info, err := s.Inspect(ctx, "m02"); err != nil || info.State != store.StateInflight {
		t.Fatalf("inspect in-flight priority message: %+v %v", info, err)
	}
	if n, err := s.Retry(ctx, c, []store.RetryAt{{ID: "m02", At: time.Now().Add(time.Hour), Reason: "x"}}); err != nil || n != 1 {
		t.Fatalf("retry %d %v", n, err)
	}
	if n, err := s.MarkDead(ctx, c, []store.Failure{{ID: "m05", Reason: "x"}}); err != nil || n != 1 {
		t.Fatalf("dead %d %v", n, err)
	}
	if n, err := s.Ack(ctx, c, acks("m08")); err != nil || n != 1 {
		t.Fatalf("ack %d %v", n, err)
	}
	if err := s.RetryDead(ctx, "m05"); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, "m29"); !errors.Is(err, store.ErrInFlight) {
		t.Fatalf("cancel of an in-flight priority message: %v, want ErrInFlight", err)
	}
	if err := s.Cancel(ctx, "m03"); err != nil {
		t.Fatal(err)
	}
	st, err = s.Stats(ctx)
	if err != nil || st.Parked != 28 || st.Dead != 0 {
		t.Fatalf("after ops: parked %d dead %d, want 28 and 0 (%v)", st.Parked, st.Dead, err)
	}
	// 10, less m08 acked; m05 retried, m29 in flight (in layout 2, in a set
	// of its own)
	if n := s.Client().ZCard(ctx, s.Keys().DueAt(0, 8)).Val() + s.Client().ZCard(ctx, s.Keys().InflightAt(0, 8)).Val(); n != 9 {
		t.Fatalf("priority 8 set holds %d, want 9", n)
	}
}

// At maxmemory with noeviction, parks are refused (ingest pauses) but
// claiming and acking still work, so firing frees memory and parks resume.
func TestFiringWorksAtMaxmemory(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t, testenv.WithArgs("--maxmemory", "3mb", "--maxmemory-policy", "noeviction"))
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 2})
	body := make([]byte, 1000)
	var parked int
	for i := 0; ; i++ {
		m := msg(fmt.Sprintf("m%05d", i), time.Now().Add(-time.Second))
		m.Body = body
		if _, err := s.Park(ctx, []*envelope.Message{m}); err != nil {
			if !store.IsOutOfMemory(err) {
				t.Fatalf("park %d: %v, want Redis's OOM", i, err)
			}
			break
		}
		parked++
		if i > 100_000 {
			t.Fatal("never reached maxmemory")
		}
	}
	// Fire half of what is parked: room for a park whatever the scripts'
	// own memory (Lua's and the script cache count in used_memory too).
	acked := 0
	for sh := 0; sh < s.Shards(); sh++ {
		c, err := s.Claim(ctx, sh, parked/2/s.Shards(), time.Minute, nil)
		if err != nil {
			t.Fatalf("claim at maxmemory: %v", err)
		}
		ids := make([]string, len(c.Messages))
		for i, m := range c.Messages {
			ids[i] = m.ID
		}
		n, err := s.Ack(ctx, c, acks(ids...))
		if err != nil {
			t.Fatalf("ack at maxmemory: %v", err)
		}
		acked += n
	}
	if acked == 0 {
		t.Fatal("nothing claimed")
	}
	m := msg("after", time.Now())
	if _, err := s.Park(ctx, []*envelope.Message{m}); err != nil {
		t.Fatalf("park after firing made room: %v", err)
	}
	t.Logf("parked %d before maxmemory, fired %d, parks resumed", parked, acked)
}

// A rejected message redelivered by its broker stays one dead message, and
// the caller's slice is not changed.
func TestRejectIsIdempotent(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	rs := []store.Rejected{{Message: msg("bad", time.Now()), Reason: "x-delay is empty"}}
	for i := 0; i < 3; i++ {
		ids, err := s.Reject(ctx, rs)
		if err != nil || ids[0] != "bad" {
			t.Fatalf("reject %d: %v %v", i, ids, err)
		}
	}
	if rs[0].Message.ID != "bad" || rs[0].Reason != "x-delay is empty" {
		t.Fatalf("caller's slice changed: %+v", rs[0])
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Dead != 1 {
		t.Fatalf("dead = %d, %v; want 1", st.Dead, err)
	}
	// Another rejection of the same ID (another reason) is kept apart.
	ids, err := s.Reject(ctx, []store.Rejected{{Message: msg("bad", time.Now()), Reason: "other"}})
	if err != nil || ids[0] == "bad" {
		t.Fatalf("a different rejection under a taken ID: %v %v", ids, err)
	}
}

// acks are the Done values of plain deliveries of ids.
func acks(ids ...string) []store.Done {
	ds := make([]store.Done, len(ids))
	for i, id := range ids {
		ds[i] = store.Done{ID: id}
	}
	return ds
}

// The layout is recorded on a new store (and on one written before layouts
// were recorded, as layout 1); a layout this build does not know is an
// error that names it, and nothing is recorded over it.
func TestLayoutRecorded(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	rdb := r.Client()
	fresh := store.New(rdb, store.Options{Prefix: "fresh", Shards: 4})
	if l, err := fresh.CheckLayout(ctx, false); err != nil || l != store.LayoutOfTests() {
		t.Fatalf("reading an empty store: %d %v", l, err)
	}
	if n, _ := rdb.Exists(ctx, fresh.Keys().Config()).Result(); n != 0 {
		t.Fatal("a read recorded a layout")
	}
	if l, err := fresh.CheckLayout(ctx, true); err != nil || l != store.LayoutOfTests() {
		t.Fatalf("a new store: %d %v", l, err)
	}
	if v, _ := rdb.HGet(ctx, fresh.Keys().Config(), "layout").Result(); v != strconv.Itoa(store.LayoutOfTests()) {
		t.Fatalf("recorded %q", v)
	}

	old := store.New(rdb, store.Options{Prefix: "old", Shards: 4})
	if err := old.CheckShards(ctx); err != nil { // what the earlier releases wrote
		t.Fatal(err)
	}
	if l, err := old.CheckLayout(ctx, true); err != nil || l != store.Layout1 {
		t.Fatalf("a store of an earlier release: %d %v", l, err)
	}

	newer := store.New(rdb, store.Options{Prefix: "newer", Shards: 4})
	rdb.HSet(ctx, newer.Keys().Config(), "shards", 4, "layout", store.LayoutNewest+1)
	_, err := newer.CheckLayout(ctx, true)
	if !errors.Is(err, store.ErrLayoutUnknown) || !strings.Contains(err.Error(), "migrate down") {
		t.Fatalf("a newer layout: %v", err)
	}
	if v, _ := rdb.HGet(ctx, newer.Keys().Config(), "layout").Result(); v != strconv.Itoa(store.LayoutNewest+1) {
		t.Fatalf("the newer layout was overwritten: %q", v)
	}
}

// A layout a newer delaybridge records while this one runs is noticed,
// never guessed at: KnowsLayout says so (for /readyz), and every script,
// migrate up and down included, refuses a shard whose marker names a
// layout this build does not know.
func TestNewerLayoutWhileRunning(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "t", Shards: 1})
	if _, err := s.CheckLayout(ctx, true); err != nil {
		t.Fatal(err)
	}
	park(t, s, store.Parked, msg("m", time.Now().Add(time.Hour)))
	if err := s.KnowsLayout(ctx); err != nil {
		t.Fatalf("KnowsLayout of this build's layout: %v", err)
	}
	newer := strconv.Itoa(store.LayoutNewest + 1)
	rdb.HSet(ctx, s.Keys().Config(), "layout", newer)
	if err := s.KnowsLayout(ctx); !errors.Is(err, store.ErrLayoutUnknown) {
		t.Fatalf("KnowsLayout of layout %s: %v", newer, err)
	}
	// Found in the record alone (a migrate beginning), it stops the
	// shards' scripts until a reading finds a layout this build knows.
	if _, err := s.Park(ctx, []*envelope.Message{msg("early", time.Now().Add(time.Hour))}); !errors.Is(err, store.ErrLayoutUnknown) {
		t.Fatalf("park with the record at layout %s: %v, want ErrLayoutUnknown", newer, err)
	}
	if rdb.HExists(ctx, s.Keys().Pool(0), "early").Val() {
		t.Fatal("parked with the record at an unknown layout")
	}
	rdb.HSet(ctx, s.Keys().Config(), "layout", store.LayoutOfTests())
	if err := s.KnowsLayout(ctx); err != nil {
		t.Fatal(err)
	}
	park(t, s, store.Parked, msg("early", time.Now().Add(time.Hour)))
	rdb.HSet(ctx, s.Keys().Config(), "layout", newer)
	rdb.Set(ctx, s.Keys().LayoutMark(0), newer, 0)
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "layout "+newer+", which this build does not know") {
			t.Errorf("%s on a shard of layout %s: %v, want refused", what, newer, err)
		}
	}
	_, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	refused("claim", err)
	_, err = s.Park(ctx, []*envelope.Message{msg("n", time.Now().Add(time.Hour))})
	refused("park", err)
	_, err = s.MigrateUp(ctx)
	refused("migrate up", err)
	_, err = s.MigrateDown(ctx)
	refused("migrate down", err)
}

// Rerecord writes the shard count and the layout given where Redis lost
// them, never over what is there, and says when what is there does not
// match: another shard count, a layout this build does not know. Finding
// them missing, it records when, which every later Rerecord returns.
func TestRerecord(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "rr", Shards: 4})
	key := store.NewKeys("rr").Config()
	before := time.Now()
	lostAt, err := s.Rerecord(ctx, store.Layout1)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.HMGet(ctx, key, "shards", "layout").Result(); fmt.Sprint(v) != "[4 1]" {
		t.Fatalf("recorded %v, want [4 1]: the layout the daemon found, not the newest", v)
	}
	if lostAt.Before(before.Truncate(time.Millisecond)) || lostAt.After(time.Now()) {
		t.Fatalf("lost at %v: want when the record was found missing (after %v)", lostAt, before)
	}
	rdb.HSet(ctx, key, "layout", store.LayoutNewest)
	again, err := s.Rerecord(ctx, store.Layout1)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.HGet(ctx, key, "layout").Result(); v != fmt.Sprint(store.LayoutNewest) {
		t.Fatalf("layout %s: Rerecord wrote over what Redis had", v)
	}
	if !again.Equal(lostAt) {
		t.Fatalf("a record that was there: lost at %v, want the time it was found missing, %v", again, lostAt)
	}
	rdb.HSet(ctx, key, "layout", "99")
	if _, err := s.Rerecord(ctx, store.Layout1); !errors.Is(err, store.ErrLayoutUnknown) {
		t.Fatalf("layout 99: %v, want ErrLayoutUnknown", err)
	}
	rdb.HSet(ctx, key, "layout", store.LayoutNewest, "shards", 8)
	if _, err := s.Rerecord(ctx, store.Layout1); !errors.Is(err, store.ErrShardMismatch) {
		t.Fatalf("shards 8: %v, want ErrShardMismatch", err)
	}
	// A store whose record was never lost: no time.
	fresh := store.New(rdb, store.Options{Prefix: "fresh", Shards: 4})
	if err := fresh.CheckShards(ctx); err != nil {
		t.Fatal(err)
	}
	if lostAt, err := fresh.Rerecord(ctx, store.Layout1); err != nil || !lostAt.IsZero() {
		t.Fatalf("a record written at start: lost at %v, %v; want none", lostAt, err)
	}
}

// FirstLog records the creation time of the first log of a name and
// returns it from then on, whatever time is given.
func TestFirstLog(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "fl", Shards: 2})
	t1, t2 := time.UnixMilli(1_765_000_000_123), time.UnixMilli(1_765_000_999_456)
	for _, c := range []struct {
		log       string
		created   time.Time
		wantFirst time.Time
	}{
		{"ORDERS", t1, t1}, // recorded
		{"ORDERS", t2, t1}, // created again: the first stays
		{"OTHER", t2, t2},  // per name
	} {
		got, err := s.FirstLog(ctx, c.log, c.created)
		if err != nil || !got.Equal(c.wantFirst) {
			t.Errorf("FirstLog(%s, %v) = %v, %v; want %v", c.log, c.created, got, err, c.wantFirst)
		}
	}
	if v, _ := rdb.HGet(ctx, store.NewKeys("fl").Config(), "log:ORDERS").Result(); v != "1765000000123" {
		t.Errorf("log:ORDERS in the config hash: %q", v)
	}
}

// The shard count is recorded as the count alone in layout 1, which the
// previous release reads, and with the layout and what to do in a later
// one, which that release then refuses (TestPreviousReleaseRefusesLayout2
// in test/fault runs it); the first start records the form of the layout
// Redis records, migrate up and down switch it (up before its first shard,
// down after its last), a later start leaves what is recorded as it is
// (builds of layout 2 before the form read the count alone), and the
// count is read from either.
func TestShardsRecordSaysTheLayout(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "sr", Shards: 4})
	key := s.Keys().Config()
	recorded := func() string { return rdb.HGet(ctx, key, "shards").Val() }
	guarded := "4 (store layout 2: run `delaybridge migrate down` of a newer release before this one)"
	if _, err := s.CheckLayout(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckShards(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[int]string{store.Layout1: "4", store.Layout2: guarded}[store.LayoutOfTests()]
	if v := recorded(); v != want {
		t.Fatalf("a new store in layout %d records %q, want %q", store.LayoutOfTests(), v, want)
	}
	if _, err := s.MigrateDown(ctx); err != nil || recorded() != "4" {
		t.Fatalf("after migrate down: %q %v, want 4", recorded(), err)
	}
	if _, err := s.MigrateUp(ctx); err != nil || recorded() != guarded {
		t.Fatalf("after migrate up: %q %v, want %q", recorded(), err, guarded)
	}
	if u, err := s.Unguarded(ctx); err != nil || u {
		t.Fatalf("Unguarded of the form: %v %v", u, err)
	}
	// Recorded by a build of layout 2 before the form: a start leaves it
	// (and the daemon warns: Unguarded), migrate up writes it.
	rdb.HSet(ctx, key, "shards", "4")
	if err := s.CheckShards(ctx); err != nil || recorded() != "4" {
		t.Fatalf("a start on a layout-2 store recorded as 4: %q %v, want it left as it is", recorded(), err)
	}
	if u, err := s.Unguarded(ctx); err != nil || !u {
		t.Fatalf("Unguarded of a layout-2 store recorded as 4: %v %v, want true", u, err)
	}
	if _, err := s.MigrateUp(ctx); err != nil || recorded() != guarded {
		t.Fatalf("migrate up on a layout-2 store recorded as 4: %q %v, want %q", recorded(), err, guarded)
	}
	if _, err := s.Rerecord(ctx, store.Layout2); err != nil {
		t.Fatalf("Rerecord over the guarded form: %v", err)
	}
	rdb.HDel(ctx, key, "shards")
	if _, err := s.Rerecord(ctx, store.Layout2); err != nil || recorded() != guarded {
		t.Fatalf("Rerecord of a lost record in layout 2: %q %v, want %q", recorded(), err, guarded)
	}
	// Another count, in either form, is refused, naming it.
	other := store.New(rdb, store.Options{Prefix: "sr", Shards: 8})
	if err := other.CheckShards(ctx); !errors.Is(err, store.ErrShardMismatch) || !strings.Contains(err.Error(), "says 4;") {
		t.Fatalf("8 shards against a record of 4: %v, want ErrShardMismatch naming 4", err)
	}
}

// Whether Redis reads script flags is said only by Redis: a Redis that
// does not answer, or a user without the right to run scripts, is an error,
// not "before 7.0" (which made a start during a Cluster failover run without
// the flags for its whole life).
func TestScriptFlagsSupported(t *testing.T) {
	r := testenv.Redis(t, testenv.WithArgs("--user", "noeval", "on", ">pw", "~*", "+@all", "-eval", "-evalsha"))
	ctx := context.Background()
	if ok, err := store.ScriptFlagsSupported(ctx, r.Client()); !ok || err != nil {
		t.Fatalf("Redis %s: %v %v, want flags read", r.Addr, ok, err)
	}
	noEval := redis.NewClient(&redis.Options{Addr: r.Addr, Username: "noeval", Password: "pw"})
	t.Cleanup(func() { _ = noEval.Close() })
	if ok, err := store.ScriptFlagsSupported(ctx, noEval); ok || err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("a user without eval: %v %v, want the NOPERM error", ok, err)
	}
	px := testenv.NewProxy(t, r.Addr)
	px.Stall()
	defer px.Flow()
	silent := redis.NewClient(&redis.Options{Addr: px.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = silent.Close() })
	if ok, err := store.ScriptFlagsSupported(ctx, silent); ok || err == nil || !store.Unreachable(err) {
		t.Fatalf("a Redis that answers nothing: %v %v, want an error Unreachable", ok, err)
	}
}
