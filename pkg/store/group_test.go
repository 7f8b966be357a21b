package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// presence reads where a message is: in the pool, in a due set, in the
// dead set, in its group's index.
type presence struct{ pool, due, dead, index bool }

func (p presence) whole() bool { return p.pool && (p.due || p.dead) && p.index }
func (p presence) none() bool  { return !p.pool && !p.due && !p.dead && !p.index }

// whereAll reads where each message is, in one pipeline.
func whereAll(t *testing.T, s *store.Store, group string, ids []string) []presence {
	t.Helper()
	ctx := context.Background()
	k := s.Keys()
	pipe := s.Client().Pipeline()
	type cmds struct {
		pool        *redis.BoolCmd
		due         []*redis.FloatCmd
		dead, index *redis.FloatCmd
	}
	all := make([]cmds, len(ids))
	for i, id := range ids {
		sh := s.ShardOf(id)
		c := cmds{pool: pipe.HExists(ctx, k.Pool(sh), id)}
		for prio := 0; prio <= store.MaxPriority; prio++ {
			c.due = append(c.due, pipe.ZScore(ctx, k.DueAt(sh, prio), id))
		}
		c.dead = pipe.ZScore(ctx, k.Dead(sh), id)
		c.index = pipe.ZScore(ctx, k.Groups(sh), group+"\x00"+id)
		all[i] = c
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	out := make([]presence, len(ids))
	for i, c := range all {
		out[i].pool = c.pool.Val()
		for _, d := range c.due {
			out[i].due = out[i].due || d.Err() == nil
		}
		out[i].dead = c.dead.Err() == nil
		out[i].index = c.index.Err() == nil
	}
	return out
}

// A message parked into a group while the group is being cancelled is
// either cancelled or kept whole (and then delivered), never half-removed:
// on a single Redis and on a cluster, where the group spans every master.
func TestCancelGroupRacesParks(t *testing.T) {
	onSingleAndCluster(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := store.New(rdb, store.Options{Prefix: "g", Shards: 16})
		const group, before = "order-42", 5000
		var msgs []*envelope.Message
		for i := range before {
			m := msg(fmt.Sprintf("early-%05d", i), time.Now().Add(-time.Second))
			m.Group = group
			msgs = append(msgs, m)
		}
		park(t, s, store.Parked, msgs...)

		// Park one message at a time into the group while it is cancelled.
		var parked atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		started := make(chan struct{})
		wg.Go(func() {
			for i := 0; ; i++ {
				if i == 10 {
					close(started)
				}
				select {
				case <-stop:
					return
				default:
				}
				m := msg(fmt.Sprintf("late-%05d", i), time.Now().Add(-time.Second))
				m.Group = group
				if _, err := s.Park(ctx, []*envelope.Message{m}); err != nil {
					t.Error(err)
					return
				}
				parked.Add(1)
			}
		})
		<-started
		n, _, err := s.CancelGroup(ctx, group)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		late := int(parked.Load())
		t.Logf("cancelled %d; %d parked into the group meanwhile", n, late)
		if n < before || n > before+late {
			t.Fatalf("cancelled %d, want %d..%d", n, before, before+late)
		}
		var early, lateIDs []string
		for i := range before {
			early = append(early, fmt.Sprintf("early-%05d", i))
		}
		for i := range late {
			lateIDs = append(lateIDs, fmt.Sprintf("late-%05d", i))
		}
		for i, p := range whereAll(t, s, group, early) {
			if !p.none() {
				t.Fatalf("%s after the cancel: %+v", early[i], p)
			}
		}
		kept := map[string]bool{}
		for i, p := range whereAll(t, s, group, lateIDs) {
			switch {
			case p.whole():
				kept[lateIDs[i]] = true
			case !p.none():
				t.Fatalf("%s is half-removed: %+v", lateIDs[i], p)
			}
		}
		if n+len(kept) != before+late {
			t.Fatalf("cancelled %d + kept %d != parked %d", n, len(kept), before+late)
		}
		// The kept ones are due: a claim takes exactly them.
		got := claimAll(t, s, time.Minute)
		if len(got) != len(kept) {
			t.Fatalf("claimed %d, kept %d", len(got), len(kept))
		}
		for id := range got {
			if !kept[id] {
				t.Fatalf("claimed %s, which was not kept", id)
			}
		}
		if ids, err := s.GroupMembers(ctx, group, 0); err != nil || len(ids) != len(kept) {
			t.Fatalf("members after: %d (%v), want %d", len(ids), err, len(kept))
		}
	})
}

// parkChunk is how many messages a test parks in one call when it parks
// many: a call of 10,000 could outlast the client's read timeout (3 s) on
// a loaded machine, and go-redis then runs the scripts again, which find
// the messages parked (Known) by the first run.
const parkChunk = 2_000

// TestCancelGroupTiming parks a group of 10,000 among 100,000 messages
// (spread over 16 shards) and logs how long cancelling it takes; the target
// is under a second. It reports, it does not assert a time:
//
//	go test -run TestCancelGroupTiming -v ./pkg/store/
//
// Its clients wait a minute for an answer: with the default 3 s, a cancel
// slowed down by a loaded machine was sent again by go-redis, which then
// answered what the second run found (0: a CI run failed so).
func TestCancelGroupTiming(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: testenv.Redis(t).Addr, ReadTimeout: time.Minute})
		t.Cleanup(func() { _ = c.Close() })
		cancelGroupTiming(t, c)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisCluster(t, 3).Addrs, ReadTimeout: time.Minute})
		t.Cleanup(func() { _ = c.Close() })
		cancelGroupTiming(t, c)
	})
}

func cancelGroupTiming(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s := store.New(rdb, store.Options{Prefix: "gt", Shards: 16})
	var msgs []*envelope.Message
	due := time.Now().Add(time.Hour)
	for i := range 100_000 {
		m := msg(fmt.Sprintf("m-%06d", i), due.Add(time.Duration(i)*time.Millisecond))
		if i%10 == 0 {
			m.Group = "big"
		} else {
			m.Group = fmt.Sprintf("g-%d", i%997)
		}
		msgs = append(msgs, m)
		if len(msgs) == parkChunk {
			park(t, s, store.Parked, msgs...)
			msgs = msgs[:0]
		}
	}
	var best time.Duration
	for round := range 3 {
		if round > 0 { // park the group again
			for i := 0; i < 100_000; i += 10 {
				m := msg(fmt.Sprintf("m-%06d", i), due)
				m.Group = "big"
				msgs = append(msgs, m)
				if len(msgs) == parkChunk {
					park(t, s, store.Parked, msgs...)
					msgs = msgs[:0]
				}
			}
		}
		start := time.Now()
		n, _, err := s.CancelGroup(ctx, "big")
		d := time.Since(start)
		if err != nil || n != 10_000 {
			t.Fatalf("cancel: %d %v", n, err)
		}
		if best == 0 || d < best {
			best = d
		}
		t.Logf("round %d: cancelled a group of 10,000 among 100,000 parked in %v", round+1, d.Round(time.Millisecond))
	}
	t.Logf("best: %v", best.Round(time.Millisecond))
	st, err := s.Stats(ctx)
	if err != nil || st.Parked != 90_000 {
		t.Fatalf("parked %d after the cancels (%v), want 90,000", st.Parked, err)
	}
}

// Held messages are counted per sink, from their hold bands.
func TestHeldBySink(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	states, err := s.SinkStates(ctx, []string{"up", "down", "paused"})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*envelope.Message
	for i := range 30 {
		m := msg(fmt.Sprintf("h%02d", i), time.Now().Add(-time.Second))
		m.Sink = []string{"up", "down", "paused"}[i%3]
		if i%2 == 0 {
			m.Priority = 4
		}
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	blocked := map[string]int{"down": states["down"].Band, "paused": states["paused"].Band}
	for sh := range s.Shards() {
		if _, err := s.Claim(ctx, sh, 100, time.Minute, blocked); err != nil {
			t.Fatal(err)
		}
	}
	bands := map[string]int{}
	for name, st := range states {
		bands[name] = st.Band
	}
	got, err := s.HeldBySink(ctx, bands)
	if err != nil || got["up"] != 0 || got["down"] != 10 || got["paused"] != 10 {
		t.Fatalf("held by sink: %v %v", got, err)
	}
}
