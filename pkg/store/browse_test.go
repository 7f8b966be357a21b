package store_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// onSingleAndCluster runs f against a single Redis and a 3-master Redis
// Cluster, where a listing's shards live on different masters.
func onSingleAndCluster(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient)) {
	t.Run("single", func(t *testing.T) { f(t, testenv.Redis(t).Client()) })
	t.Run("cluster", func(t *testing.T) {
		c := testenv.RedisCluster(t, 3).Client()
		t.Cleanup(func() { _ = c.Close() })
		f(t, c)
	})
}

// oracleEntry is a message as the test reads it from Redis itself: its
// position time (score without its hold band) and state.
type oracleEntry struct {
	at    float64
	id    string
	state string
	held  bool
}

// oracle lists every parked (or, dead, every dead) message straight from
// the sorted sets, in (position time, ID) order, independently of the
// browse script.
func oracle(t *testing.T, s *store.Store, dead bool) []oracleEntry {
	t.Helper()
	ctx := context.Background()
	rdb := s.Client()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []oracleEntry
	k := s.Keys()
	for sh := 0; sh < s.Shards(); sh++ {
		// Each key with the mark its scores get on the wire, and whether
		// it holds held messages (a score of any layout, read as it is:
		// layout 2's keys do not exist in layout 1, and its due sets hold
		// parked messages only).
		type src struct {
			key  string
			mark float64
			held bool
		}
		var keys []src
		if dead {
			keys = []src{{key: k.Dead(sh)}}
		} else {
			for p := 0; p <= store.MaxPriority; p++ {
				keys = append(keys, src{key: k.DueAt(sh, p)}, src{key: k.InflightAt(sh, p), mark: 0.5},
					src{key: k.AheadAt(sh, p), mark: 0.75}, src{key: k.SlotAt(sh, p), mark: 0.25})
			}
			for b := range 4 {
				for _, key := range k.HeldSets(sh, b) {
					keys = append(keys, src{key: key, held: true})
				}
			}
		}
		for _, from := range keys {
			zs, err := rdb.ZRangeWithScores(ctx, from.key, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, z := range zs {
				score := z.Score + from.mark
				e := oracleEntry{at: score, id: z.Member.(string)}
				switch held, _ := store.Held(score); {
				case dead:
					e.state = store.StateDead
				case from.held:
					e.state, e.held = store.StateHeld, true
				case held:
					e.at = math.Mod(score, float64(store.HoldBand))
					e.state, e.held = store.StateHeld, true
				case math.Mod(score, 1) == 0.5 && score > float64(now.UnixMilli()):
					e.state = store.StateInflight
				default:
					e.state = store.StateScheduled
				}
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b oracleEntry) int {
		if a.at != b.at {
			if a.at < b.at {
				return -1
			}
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
	return out
}

// browseAll pages through a listing and returns the IDs in order, the
// pages and the most entries a page examined.
func browseAll(t *testing.T, s *store.Store, q store.BrowseQuery) (ids []string, pages, examined int) {
	t.Helper()
	seen := map[string]bool{}
	for {
		p, err := s.Browse(context.Background(), q)
		if err != nil {
			t.Fatalf("browse %+v: %v", q, err)
		}
		pages++
		examined = max(examined, p.Examined)
		if limit := cmp.Or(q.Limit, store.DefaultBrowseLimit); len(p.Messages) > limit {
			t.Fatalf("page of %d, limit %d", len(p.Messages), q.Limit)
		}
		for _, m := range p.Messages {
			if seen[m.ID] {
				t.Fatalf("%s listed twice (query %+v)", m.ID, q)
			}
			seen[m.ID] = true
			ids = append(ids, m.ID)
		}
		if p.Next == "" {
			return ids, pages, examined
		}
		if pages > 10000 {
			t.Fatal("the listing does not end")
		}
		q.Cursor = p.Next
	}
}

// browseFixture parks a mix: equal due times (ties broken by ID), two
// priorities, two sinks, destinations and ingests, groups, recurring
// messages; then puts some in flight, holds the due ones of sink b, and
// kills some. It returns the messages by ID.
func browseFixture(t *testing.T, s *store.Store) map[string]*envelope.Message {
	t.Helper()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	base := time.Now().Truncate(time.Second).Add(time.Hour)
	all := map[string]*envelope.Message{}
	var msgs []*envelope.Message
	for i := range 300 {
		due := base.Add(time.Duration(r.IntN(40)) * time.Second) // many share a due time
		if i%5 == 0 {
			due = time.Now().Add(-time.Duration(1+r.IntN(100)) * time.Second) // due already
		}
		m := msg(fmt.Sprintf("m-%03d", r.IntN(1000)*1000+i), due)
		m.Sink = []string{"a", "b"}[i%2]
		m.Destination = []string{"d1", "d2", "d3"}[i%3]
		m.Ingest = []string{"i1", "i2"}[i%5/4]
		switch {
		case i%7 == 0:
			m.Group = "g-small"
		case i%3 == 1:
			m.Group = "g-big"
		}
		if i%11 == 0 {
			m.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: m.DueAt, N: 1}
		}
		if i%4 == 0 {
			m.Priority = 3
		}
		all[m.ID] = m
		msgs = append(msgs, m)
	}
	park(t, s, store.Parked, msgs...)
	states, err := s.SinkStates(ctx, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	// Claim the due messages: those of b are held, those of a in flight;
	// then some in flight go dead.
	for sh := 0; sh < s.Shards(); sh++ {
		c, err := s.Claim(ctx, sh, 1000, time.Minute, map[string]int{"b": states["b"].Band})
		if err != nil {
			t.Fatal(err)
		}
		var deads []store.Failure
		for i, m := range c.Messages {
			if i%2 == 0 {
				deads = append(deads, store.Failure{ID: m.ID, Reason: "test"})
			}
		}
		if _, err := s.MarkDead(ctx, c, deads); err != nil {
			t.Fatal(err)
		}
	}
	return all
}

func TestBrowse(t *testing.T) {
	onSingleAndCluster(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := store.New(rdb, store.Options{Prefix: "b", Shards: 5})
		msgs := browseFixture(t, s)
		want := oracle(t, s, false)
		states := map[string]int{}
		for _, e := range want {
			states[e.state]++
			if e.held {
				states["held"]++
			}
		}
		if states[store.StateInflight] == 0 || states["held"] == 0 || states[store.StateScheduled] < 200 {
			t.Fatalf("the fixture lacks a state: %v", states)
		}
		ids := func(es []oracleEntry, keep func(oracleEntry) bool) []string {
			var out []string
			for _, e := range es {
				if keep(e) {
					out = append(out, e.id)
				}
			}
			return out
		}
		every := func(oracleEntry) bool { return true }

		// Every parked message, in order, whatever the page size.
		for _, limit := range []int{1, 7, 100, 1000} {
			got, pages, _ := browseAll(t, s, store.BrowseQuery{Limit: limit})
			if w := ids(want, every); !slices.Equal(got, w) {
				t.Fatalf("limit %d: listing differs from the sorted sets:\n got %v\nwant %v", limit, got, w)
			}
			if limit == 1 && pages < len(want) {
				t.Fatalf("limit 1 took %d pages for %d messages", pages, len(want))
			}
		}
		// What a page says of each message matches Inspect.
		p, err := s.Browse(ctx, store.BrowseQuery{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range p.Messages {
			in := inspect(t, s, got.ID)
			if got.State != in.State || got.Held != in.Held || !got.NextAt.Equal(in.NextAt) || got.Attempts != in.Attempts ||
				got.Message.DueAt != in.Message.DueAt || got.Message.Sink != in.Message.Sink {
				t.Fatalf("%s: browse %+v, inspect %+v", got.ID, got, in)
			}
		}

		// Each filter, alone and together, against the oracle and the
		// messages as parked.
		cases := []struct {
			q    store.BrowseQuery
			keep func(oracleEntry) bool
		}{
			{store.BrowseQuery{State: store.StateScheduled}, func(e oracleEntry) bool { return e.state == store.StateScheduled }},
			{store.BrowseQuery{State: store.StateInflight}, func(e oracleEntry) bool { return e.state == store.StateInflight }},
			{store.BrowseQuery{State: store.StateHeld}, func(e oracleEntry) bool { return e.state == store.StateHeld }},
			{store.BrowseQuery{State: store.StateHeld, Sink: "b", Group: "g-big"}, func(e oracleEntry) bool {
				return e.state == store.StateHeld && msgs[e.id].Sink == "b" && msgs[e.id].Group == "g-big"
			}},
			{store.BrowseQuery{Sink: "b"}, func(e oracleEntry) bool { return msgs[e.id].Sink == "b" }},
			{store.BrowseQuery{Destination: "d2"}, func(e oracleEntry) bool { return msgs[e.id].Destination == "d2" }},
			{store.BrowseQuery{Ingest: "i2"}, func(e oracleEntry) bool { return msgs[e.id].Ingest == "i2" }},
			{store.BrowseQuery{Group: "g-small"}, func(e oracleEntry) bool { return msgs[e.id].Group == "g-small" }},
			{store.BrowseQuery{Group: "g-big", Sink: "a"}, func(e oracleEntry) bool { return msgs[e.id].Group == "g-big" && msgs[e.id].Sink == "a" }},
			{store.BrowseQuery{Recurring: true}, func(e oracleEntry) bool { return msgs[e.id].Recur != nil }},
			{store.BrowseQuery{Sink: "a", Destination: "d1", State: store.StateScheduled},
				func(e oracleEntry) bool {
					return msgs[e.id].Sink == "a" && msgs[e.id].Destination == "d1" && e.state == store.StateScheduled
				}},
		}
		for _, c := range cases {
			for _, limit := range []int{3, 50} {
				q := c.q
				q.Limit = limit
				got, _, examined := browseAll(t, s, q)
				if w := ids(want, c.keep); !slices.Equal(got, w) {
					t.Fatalf("%+v: got %v\nwant %v", q, got, w)
				}
				if bound := s.Shards() * ((store.BrowseScanFactor*limit + s.Shards() - 1) / s.Shards()); q.Group == "" && examined > bound {
					t.Errorf("%+v: a page examined %d entries, over the bound %d", q, examined, bound)
				}
			}
		}
		// The group filter scans when a shard holds many of the group.
		restore := store.SetBrowseGroupIndexMax(2)
		got, _, _ := browseAll(t, s, store.BrowseQuery{Group: "g-big", Limit: 4})
		restore()
		if w := ids(want, func(e oracleEntry) bool { return msgs[e.id].Group == "g-big" }); !slices.Equal(got, w) {
			t.Fatalf("group by scan: got %v\nwant %v", got, w)
		}

		// A filtered page stops after examining its bound: a rare match
		// comes back over several pages, some of them empty, none lost.
		rare := want[len(want)/2].id
		q := store.BrowseQuery{Sink: msgs[rare].Sink, Destination: msgs[rare].Destination, Ingest: msgs[rare].Ingest, Limit: 1}
		wantRare := ids(want, func(e oracleEntry) bool {
			m := msgs[e.id]
			return m.Sink == q.Sink && m.Destination == q.Destination && m.Ingest == q.Ingest
		})
		got, pages, _ := browseAll(t, s, q)
		if !slices.Equal(got, wantRare) || pages < len(want)/(store.BrowseScanFactor*s.Shards()) {
			t.Fatalf("bounded scan: %d pages, got %v, want %v", pages, got, wantRare)
		}

		// Position range: [after, before).
		from, to := time.UnixMilli(int64(want[40].at)), time.UnixMilli(int64(want[200].at))
		got, _, _ = browseAll(t, s, store.BrowseQuery{DueAfter: from, DueBefore: to, Limit: 9})
		if w := ids(want, func(e oracleEntry) bool { return e.at >= float64(from.UnixMilli()) && e.at < float64(to.UnixMilli()) }); !slices.Equal(got, w) {
			t.Fatalf("range: got %v\nwant %v", got, w)
		}

		// The dead, by time of death.
		dead := oracle(t, s, true)
		if len(dead) == 0 {
			t.Fatal("the fixture has no dead messages")
		}
		got, _, _ = browseAll(t, s, store.BrowseQuery{State: store.StateDead, Limit: 2})
		if w := ids(dead, every); !slices.Equal(got, w) {
			t.Fatalf("dead: got %v\nwant %v", got, w)
		}
		dp, err := s.Browse(ctx, store.BrowseQuery{State: store.StateDead, Limit: 1})
		if err != nil || len(dp.Messages) != 1 || dp.Messages[0].State != store.StateDead || dp.Messages[0].Reason != "test" {
			t.Fatalf("dead page: %+v %v", dp, err)
		}

		// Cursors: altered, cut or from another listing are refused.
		pp, err := s.Browse(ctx, store.BrowseQuery{Limit: 5})
		if err != nil || pp.Next == "" {
			t.Fatalf("first page: %+v %v", pp, err)
		}
		bad := []string{
			pp.Next[:len(pp.Next)-1],
			pp.Next[:10],
			flip(pp.Next, 3),
			flip(pp.Next, len(pp.Next)-2),
			"not a cursor",
			pp.Next + "AAAA",
		}
		for _, c := range bad {
			if _, err := s.Browse(ctx, store.BrowseQuery{Cursor: c}); !errors.Is(err, store.ErrBadCursor) {
				t.Errorf("cursor %q: %v, want ErrBadCursor", c, err)
			}
		}
		if _, err := s.Browse(ctx, store.BrowseQuery{State: store.StateDead, Cursor: pp.Next}); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("a parked listing's cursor for the dead: %v", err)
		}
		// Another instance (another Store on the same Redis) reads it.
		other := store.New(rdb, store.Options{Prefix: "b", Shards: 5})
		np, err := other.Browse(ctx, store.BrowseQuery{Limit: 5, Cursor: pp.Next})
		if err != nil || len(np.Messages) != 5 || np.Messages[0].ID != want[5].id {
			t.Fatalf("the next page from another instance: %+v %v", np, err)
		}
		// A deployment with another prefix does not.
		if _, err := store.New(rdb, store.Options{Prefix: "c", Shards: 5}).Browse(ctx, store.BrowseQuery{Cursor: pp.Next}); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("another deployment's cursor: %v", err)
		}
	})
}

// flip changes the character at i of a base64url string.
func flip(s string, i int) string {
	b := []byte(s)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// Browsing keeps its order and loses nothing while messages come and go
// between pages: those that stay are listed once each, in order.
func TestBrowseWhileMessagesChange(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	base := time.Now().Add(time.Hour)
	var msgs []*envelope.Message
	for i := range 200 {
		msgs = append(msgs, msg(fmt.Sprintf("s-%03d", i), base.Add(time.Duration(i/3)*time.Second)))
	}
	park(t, s, store.Parked, msgs...)
	q := store.BrowseQuery{Limit: 10}
	var got []string
	for i := 0; ; i++ {
		p, err := s.Browse(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Messages {
			got = append(got, m.ID)
		}
		// Meanwhile: cancel one ahead, park one behind the cursor and one
		// ahead of it.
		if err := s.Cancel(ctx, fmt.Sprintf("s-%03d", 199-i)); err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		park(t, s, store.Parked, msg(fmt.Sprintf("behind-%d", i), base.Add(-time.Minute)),
			msg(fmt.Sprintf("ahead-%d", i), base.Add(time.Duration(100+i)*time.Second)))
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	var stayed []string
	for _, id := range got {
		if strings.HasPrefix(id, "behind-") {
			t.Fatalf("%s was parked behind the cursor and listed", id)
		}
		if strings.HasPrefix(id, "s-") {
			stayed = append(stayed, id)
		}
	}
	if !slices.IsSorted(stayed) || len(stayed) < 100 {
		t.Fatalf("listed out of order or too few: %v", stayed)
	}
	if !slices.ContainsFunc(got, func(id string) bool { return strings.HasPrefix(id, "ahead-") }) {
		t.Fatalf("no message parked ahead of the cursor was listed: %v", got)
	}
}

// When one shard holds every message, pages are still full: the first
// round's share per shard does not fill them, and a second round does.
func TestBrowseOneShardHoldsAll(t *testing.T) {
	s := newStore(t, 8)
	due := time.Now().Add(time.Hour)
	var msgs []*envelope.Message
	var want []string
	for i := 0; len(msgs) < 60; i++ {
		id := fmt.Sprintf("one-%04d", i)
		if s.ShardOf(id) == 3 {
			msgs = append(msgs, msg(id, due.Add(time.Duration(len(msgs))*time.Millisecond)))
			want = append(want, id)
		}
	}
	park(t, s, store.Parked, msgs...)
	q := store.BrowseQuery{Limit: 25}
	var got []string
	for {
		p, err := s.Browse(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if p.Next != "" && len(p.Messages) != 25 {
			t.Fatalf("a page of %d before the end", len(p.Messages))
		}
		for _, m := range p.Messages {
			got = append(got, m.ID)
		}
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

// A listing by state walks only the sets of that state: scheduled messages
// behind a held backlog come on the first page, not after pages that
// examined the held ones and found nothing, and held ones the same way.
func TestBrowseByStateSkipsTheOtherStates(t *testing.T) {
	onSingleAndCluster(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := store.New(rdb, store.Options{Prefix: "bs", Shards: 4})
		var held []*envelope.Message
		for i := range 400 {
			m := msg(fmt.Sprintf("held-%03d", i), time.Now().Add(-time.Minute))
			m.Sink = "b"
			held = append(held, m)
		}
		park(t, s, store.Parked, held...)
		states, err := s.SinkStates(ctx, []string{"b"})
		if err != nil {
			t.Fatal(err)
		}
		for sh := 0; sh < s.Shards(); sh++ {
			if _, err := s.Claim(ctx, sh, 1000, time.Minute, map[string]int{"b": states["b"].Band}); err != nil {
				t.Fatal(err)
			}
		}
		var later []*envelope.Message
		for i := range 3 {
			m := msg(fmt.Sprintf("later-%d", i), time.Now().Add(time.Hour))
			m.Sink = "a"
			later = append(later, m)
		}
		park(t, s, store.Parked, later...)

		p, err := s.Browse(ctx, store.BrowseQuery{State: store.StateScheduled, Limit: 5})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Messages) != 3 || p.Next != "" {
			t.Fatalf("scheduled behind 400 held: a first page of %d messages (next %q), examined %d; want the 3 and no next page",
				len(p.Messages), p.Next, p.Examined)
		}
		p, err = s.Browse(ctx, store.BrowseQuery{State: store.StateHeld, DueAfter: time.Now().Add(-30 * time.Second), Limit: 5})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Messages) != 0 || p.Next != "" || p.Examined != 0 {
			t.Fatalf("held due after the held backlog: %d messages, next %q, examined %d; want none, at once", len(p.Messages), p.Next, p.Examined)
		}
		got, _, _ := browseAll(t, s, store.BrowseQuery{State: store.StateHeld, Limit: 50})
		if len(got) != 400 {
			t.Fatalf("held: listed %d of 400", len(got))
		}
	})
}
