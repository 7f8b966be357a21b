package store_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The tally of what each source holds is kept by every path that makes or
// ends a live message or series, and agrees with a census of the messages
// after each one.
func TestTallyKeepsCountOnEveryPath(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	if n, err := s.Census(ctx, false); err != nil || n != 4 {
		t.Fatalf("census of a new store: %d shards, %v", n, err)
	}
	past := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	from := func(src, id string, recur bool) *envelope.Message {
		m := msg(id, past)
		m.Ingest = src
		if recur {
			m.Recur = &envelope.Recurrence{Every: time.Hour, Anchor: past, N: 1}
		}
		return m
	}
	check := func(step string, want map[string]store.SourceStats) {
		t.Helper()
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Uncounted) > 0 {
			t.Fatalf("%s: shards %v uncounted", step, st.Uncounted)
		}
		kept := clean(st.Sources)
		if want != nil && !maps.Equal(kept, want) {
			t.Errorf("%s: tally %v, want %v", step, kept, want)
		}
		if _, err := s.Census(ctx, true); err != nil {
			t.Fatal(err)
		}
		if st, err = s.Stats(ctx); err != nil {
			t.Fatal(err)
		}
		if counted := clean(st.Sources); !maps.Equal(kept, counted) {
			t.Errorf("%s: tally kept %v, a census counts %v", step, kept, counted)
		}
	}

	var msgs []*envelope.Message
	for _, id := range []string{"a1", "a2", "a3", "a4", "a5", "a6"} {
		msgs = append(msgs, from("a", id, false))
	}
	msgs = append(msgs, from("a", "a-every", true), from("a", "a-ends", true), from("b", "b1", false), from("b", "b2", false),
		from("b", "b-every", true), from("", "api1", false))
	g1, g2 := from("a", "ga", false), from("b", "gb", false)
	g1.Group, g2.Group = "g", "g"
	msgs = append(msgs, g1, g2)
	park(t, s, store.Parked, msgs...)
	check("parked", map[string]store.SourceStats{"a": {Live: 9, Series: 2}, "b": {Live: 4, Series: 1}, "": {Live: 1}})
	if _, err := s.Park(ctx, []*envelope.Message{from("b", "a1", false)}); err != nil { // id_taken: nothing changes
		t.Fatal(err)
	}
	check("id taken", nil)

	for sh := 0; sh < s.Shards(); sh++ {
		c, err := s.Claim(ctx, sh, 100, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		var st store.Settlement
		st.Lease = c
		for _, m := range c.Messages {
			switch id := m.Message.ID; id {
			case "a1", "api1", "a-ends":
				st.Done = append(st.Done, store.Done{ID: id, Source: m.Message.Ingest})
			case "a-every", "b-every":
				next := *m.Message
				next.DueAt = past.Add(time.Hour)
				st.Done = append(st.Done, store.Done{ID: id, Source: m.Message.Ingest, Next: &next})
			case "a2":
				st.Retry = append(st.Retry, store.RetryAt{ID: id, At: past, Reason: "boom"})
			case "a3", "b1":
				st.Dead = append(st.Dead, store.Failure{ID: id, Reason: "refused"})
			case "a4":
				// a follower: a new message of a4's ID while it is in flight
				if r, err := s.Park(ctx, []*envelope.Message{from("a", "a4", false)}); err != nil || r[0] != store.Queued {
					t.Fatalf("follower: %v %v", r, err)
				}
				st.Done = append(st.Done, store.Done{ID: id, Source: "a"})
			default: // parked again, uncounted
				st.Postpone = append(st.Postpone, store.RetryAt{ID: id, At: past.Add(time.Hour)})
			}
		}
		if _, errs := s.Settle(ctx, []store.Settlement{st}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	// a1, api1, a-ends delivered; a3, b1 dead; a4 delivered and its
	// follower parked; the series a-ends ended.
	check("settled", map[string]store.SourceStats{"a": {Live: 6, Series: 1, Dead: 1}, "b": {Live: 3, Series: 1, Dead: 1}})

	if err := s.Cancel(ctx, "a5"); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, "b1"); err != nil { // dead: its count is not live
		t.Fatal(err)
	}
	check("cancelled", map[string]store.SourceStats{"a": {Live: 5, Series: 1, Dead: 1}, "b": {Live: 3, Series: 1}})
	if _, _, err := s.CancelGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	check("group cancelled", map[string]store.SourceStats{"a": {Live: 4, Series: 1, Dead: 1}, "b": {Live: 2, Series: 1}})

	if _, err := s.Reject(ctx, []store.Rejected{{Message: from("b", "b-bad", false), Reason: "bad"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.RetryDead(ctx, "a3"); err != nil {
		t.Fatal(err)
	}
	replacement := from("b", "b-bad", false)
	replacement.Replace = true
	park(t, s, store.Replaced, replacement)
	check("revived", map[string]store.SourceStats{"a": {Live: 5, Series: 1}, "b": {Live: 3, Series: 1}})
	// An export imported over the same store replaces each message by
	// itself; into a new one, it is counted there as it was here.
	var dump bytes.Buffer
	if _, err := s.Export(ctx, &dump, store.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]store.SourceStats{"a": {Live: 5, Series: 1}, "b": {Live: 3, Series: 1}}
	if _, err := s.Import(ctx, bytes.NewReader(dump.Bytes()), store.ImportOptions{Replace: true, Admit: asExported}); err != nil {
		t.Fatal(err)
	}
	check("imported over", want)
	other := newStoreWith(t, store.Options{Prefix: "other", Shards: 4})
	if _, err := other.Census(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Import(ctx, bytes.NewReader(dump.Bytes()), store.ImportOptions{Admit: asExported}); err != nil {
		t.Fatal(err)
	}
	if st, err := other.Stats(ctx); err != nil || !maps.Equal(clean(st.Sources), want) {
		t.Errorf("imported into a new store: %v %v, want %v", clean(st.Sources), err, want)
	}
	if _, err := s.PurgeDead(ctx); err != nil {
		t.Fatal(err)
	}
	check("purged", nil)
}

// clean drops the sources that hold nothing, which a tally keeps as 0 and a
// census leaves out.
func clean(m map[string]store.SourceStats) map[string]store.SourceStats {
	out := map[string]store.SourceStats{}
	for k, v := range m {
		if v != (store.SourceStats{}) {
			out[k] = v
		}
	}
	return out
}

// A new recurring series past its ingest's share of ingest[].max_series is
// refused for that ingest alone; another ingest, and the admin API, still
// park theirs.
func TestSourceSeriesBound(t *testing.T) {
	ctx := context.Background()
	r := newStoreWith(t, store.Options{Prefix: "t", Shards: 1, SourceSeries: map[string]int64{"noisy": 2}})
	if _, err := r.Census(ctx, false); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(time.Hour)
	series := func(src, id string) *envelope.Message {
		m := msg(id, due)
		m.Ingest, m.Recur = src, &envelope.Recurrence{Every: time.Hour, Anchor: due, N: 1}
		return m
	}
	park(t, r, store.Parked, series("noisy", "n1"), series("noisy", "n2"), series("calm", "c1"), series("", "api"))
	park(t, r, store.OverSourceSeries, series("noisy", "n3"))
	park(t, r, store.Parked, series("calm", "c2"))
	one := msg("n-once", due)
	one.Ingest = "noisy"
	park(t, r, store.Parked, one) // not a series: no bound of series
	if err := r.Cancel(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	park(t, r, store.Parked, series("noisy", "n3"))
}

func newStoreWith(t *testing.T, o store.Options) *store.Store {
	t.Helper()
	return store.New(testenv.Redis(t).Client(), o)
}

// The dead messages beyond limits.max_dead_messages are the oldest of the
// source that holds the most: one source's dead push out another's only
// while it holds more. A dead entry a build before the index wrote (none
// in deadby) goes first.
func TestDeadBoundedPerSource(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 1, MaxDead: 10})
	reject := func(src string, ids ...string) {
		t.Helper()
		for _, id := range ids {
			m := msg(id, time.Now())
			m.Ingest = src
			if _, err := s.Reject(ctx, []store.Rejected{{Message: m, Reason: "bad"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	dead := func(step string, want ...string) {
		t.Helper()
		got := deadIDs(t, s)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: dead %v, want %v", step, got, want)
		}
	}
	reject("noisy", "n00", "n01", "n02", "n03", "n04", "n05", "n06", "n07", "n08", "n09")
	reject("calm", "c0", "c1", "c2")
	dead("the calm source's first three", "n03", "n04", "n05", "n06", "n07", "n08", "n09", "c0", "c1", "c2")

	// As a build before the index left it: in pool and dead, not in deadby.
	keys := store.NewKeys("t")
	blob, err := r.Client().HGet(ctx, keys.Pool(0), "c0").Result()
	if err != nil {
		t.Fatal(err)
	}
	r.Client().HSet(ctx, keys.Pool(0), "legacy", blob)
	r.Client().ZAdd(ctx, keys.Dead(0), redis.Z{Score: float64(time.Now().Add(-time.Hour).UnixMilli()), Member: "legacy"})
	reject("calm", "c3")
	dead("a legacy entry, then the noisy source's oldest", "n04", "n05", "n06", "n07", "n08", "n09", "c0", "c1", "c2", "c3")

	reject("calm", "c4", "c5", "c6", "c7", "c8", "c9")
	dead("each source its newest half", "n05", "n06", "n07", "n08", "n09", "c5", "c6", "c7", "c8", "c9")
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sources["noisy"].Dead != 5 || st.Sources["calm"].Dead != 5 {
		t.Errorf("tally of the dead: %+v, want 5 each", st.Sources)
	}
	if n, _ := r.Client().ZCard(ctx, keys.DeadBy(0)).Result(); n != 10 {
		t.Errorf("deadby holds %d entries, want 10", n)
	}
}

// limits.max_dead holds each source to its own bound across the shards:
// the oldest of a source beyond it go, the other sources keep theirs, and
// a source under it is left alone.
func TestTrimDeadPerSource(t *testing.T) {
	ctx := context.Background()
	s := newStoreWith(t, store.Options{Prefix: "t", Shards: 16})
	var want []string
	reject := func(src, prefix string, n, keep int) {
		t.Helper()
		for i := range n {
			m := msg(fmt.Sprintf("%s%02d", prefix, i), time.Now())
			m.Ingest = src
			if _, err := s.Reject(ctx, []store.Rejected{{Message: m, Reason: "bad"}}); err != nil {
				t.Fatal(err)
			}
			if i >= n-keep {
				want = append(want, m.ID)
			}
		}
	}
	reject("noisy", "n", 40, 5)
	reject("calm", "c", 3, 3)
	reject("", "api", 7, 5) // the admin API
	n, err := s.TrimDeadPerSource(ctx, []string{"", "noisy", "calm"}, 5)
	if err != nil || n != 37 {
		t.Fatalf("TrimDeadPerSource deleted %d (%v), want 35 of noisy and 2 of the API", n, err)
	}
	got := deadIDs(t, s)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("dead after the trim: %v, want each source's newest 5: %v", got, want)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sources["noisy"].Dead != 5 || st.Sources["calm"].Dead != 3 || st.Sources[""].Dead != 5 {
		t.Errorf("tally of the dead: %+v", st.Sources)
	}
	if n, err := s.TrimDeadPerSource(ctx, []string{"", "noisy", "calm"}, 5); n != 0 || err != nil {
		t.Errorf("a second trim deleted %d (%v), want 0", n, err)
	}
}

// deadIDs returns the IDs of the store's dead messages, sorted.
func deadIDs(t *testing.T, s *store.Store) []string {
	t.Helper()
	infos, err := s.ListDead(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range infos {
		ids = append(ids, in.ID)
	}
	slices.Sort(ids)
	return ids
}
